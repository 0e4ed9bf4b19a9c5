"""Adds the decode phase timeline (bench/timeline/README.md) to a scratch copy of the source tree:
    python3 bench/timeline/decode_timeline_patch.py /tmp/tree   (a git archive of the commit)
thread 0 of every decode CTA (bf16 d128) stamps %globaltimer and clock64 at 10 points into a
__device__ array that `fa4_ts_fetch` (added to the bf16 d128 instantiation) copies out. Exact-text
edits: it fails loudly (assert) on a kernel whose text moved."""
import sys
root = sys.argv[1]
hdr='''
// ---- TIMELINE DIAGNOSTIC (scratch tree only) ----
static __device__ unsigned long long g_fa4_ts[8192 * 32];
__device__ __forceinline__ void fa4_ts(int k) {
  if (threadIdx.x != 0) return;
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= 8192) return;
  unsigned long long t, c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  g_fa4_ts[cta * 32 + k] = t;
  g_fa4_ts[cta * 32 + 16 + k] = c;
}
__device__ __forceinline__ void fa4_ts_val(int k, unsigned long long v) {
  if (threadIdx.x != 0) return;
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta < 8192) g_fa4_ts[cta * 32 + k] = v;
}
'''


def insert(anchor, text, before=False):
    """Inserts `text` after (or before) `anchor`, exact kernel text that must occur once."""
    global s
    assert s.count(anchor) == 1, ("no unique anchor", f, anchor)
    s = s.replace(anchor, text + anchor if before else anchor + text)
def edit(name=None):
    """Writes the file being edited (if any) and opens src/hopper/decode/<name> (if given)."""
    global f, s
    if f:
        open(f, 'w').write(s)
    f = root + '/src/hopper/decode/' + name if name else None
    s = open(f).read() if name else None
f = None
edit('args_decode.cuh')  # included first by the merge and the kernel
insert('namespace fa4::hopper::decode {\n', hdr)
edit('kernel_decode.cuh')
insert("  const int32_t row0 = row_tile * 16;\n",
       "  fa4_ts(0);\n  { unsigned smid; asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(smid)); fa4_ts_val(12, smid); }\n")
# the stamp depends on the loaded length, so it cannot move above the load
insert("  const int32_t seqlen_k = cs.seqlen_k;\n", "  if (seqlen_k != -12345) fa4_ts(1);\n")
insert("  const int32_t n_iter = bad ? 0 : t_hi - t_lo;\n", "  fa4_ts_val(13, n_iter);\n")
insert("    const Elem* sV = sK + kBlockN * kD;\n", "    if (it == 0) fa4_ts(2);\n")
insert("  __syncthreads();  // the ring is free: it becomes the merge buffer\n", "  fa4_ts(3);\n")
insert("  arch::cluster_wait();  // the kernel-start arrival: every peer has started\n", "  fa4_ts(4);\n")
insert("  arch::cluster_arrive_release();\n", "  fa4_ts(5);\n", before=True)
insert("  const bool cluster_bad = cluster_merge", "  fa4_ts(6);\n", before=True)
insert("rows, recv);\n", "  fa4_ts(7);\n")
insert("}\n\n}  // namespace fa4::hopper::decode", "  __syncthreads();\n  fa4_ts(9);\n", before=True)
# the path without a cluster returns before the cluster code: its end stamp too
insert("    return;\n  }\n  // ---- with a cluster", "    __syncthreads();\n    fa4_ts(9);\n", before=True)
edit('merge_decode.cuh')
insert("  return *s_last != 0;\n", "  fa4_ts(8);\n", before=True)  # every arrival at a tile's counter
insert("  const int64_t lse_stride = int64_t(p.batch) * p.num_heads * p.seqlen_q;  // one partial's\n",
       "  fa4_ts_val(14, 1);\n")  # the CTA that merges the tile's global partials
edit()
f=root+'/src/hopper/decode/instantiations/decode_bf16_hdim128.cu'
s=open(f).read()
s+='''
extern "C" __attribute__((visibility("default"))) int fa4_ts_fetch(unsigned long long* host, int reset) {
  if (reset) {
    static unsigned long long zeros[8192 * 32];
    return int(cudaMemcpyToSymbol(fa4::hopper::decode::g_fa4_ts, zeros, sizeof(zeros)));
  }
  return int(cudaMemcpyFromSymbol(host, fa4::hopper::decode::g_fa4_ts, sizeof(unsigned long long) * 8192 * 32));
}
'''
open(f,'w').write(s)
