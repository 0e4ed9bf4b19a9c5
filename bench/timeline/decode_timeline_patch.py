"""Adds the decode phase timeline (bench/timeline/README.md) to a scratch copy of the source tree:
    python3 bench/timeline/decode_timeline_patch.py /tmp/tree   (a git archive of the commit)
thread 0 of every decode CTA (bf16 d128) stamps %globaltimer and clock64 at 10 points into a
__device__ array that `fa4_ts_fetch` (added to the bf16 d128 instantiation) copies out. Exact-text
edits: it fails loudly (assert) on a kernel whose text moved."""
import sys
root = sys.argv[1]
f=root+'/src/hopper/decode/kernel_decode.cuh'
s=open(f).read()
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
assert s.count('namespace fa4::hopper::decode {\n') == 1
s=s.replace('namespace fa4::hopper::decode {\n','namespace fa4::hopper::decode {\n'+hdr,1)
def rep(old,new):
    global s
    assert s.count(old)==1,(old)
    s=s.replace(old,new)
rep('''  const int32_t row0 = row_tile * 16;

  // ---- sequence''','''  const int32_t row0 = row_tile * 16;
  fa4_ts(0);
  { unsigned smid; asm volatile("mov.u32 %0, %%smid;" : "=r"(smid)); fa4_ts_val(12, smid); }

  // ---- sequence''')
rep('''  uint32_t bad = cs.bad;
  const int32_t seqlen_k = cs.seqlen_k;
''','''  uint32_t bad = cs.bad;
  const int32_t seqlen_k = cs.seqlen_k;
  if (seqlen_k != -12345) fa4_ts(1);
''')
rep('''  const int32_t n_iter = bad ? 0 : t_hi - t_lo;
''','''  const int32_t n_iter = bad ? 0 : t_hi - t_lo;
  fa4_ts_val(13, n_iter);
''')
rep('''    const Elem* sK = sRing + (it % kStages) * Smem::kStageElems;
    const Elem* sV = sK + kBlockN * kD;
''','''    const Elem* sK = sRing + (it % kStages) * Smem::kStageElems;
    const Elem* sV = sK + kBlockN * kD;
    if (it == 0) fa4_ts(2);
''')
rep('''  arch::cp_async_wait<0>();
  __syncthreads();  // the ring is free: it becomes the merge buffer
''','''  arch::cp_async_wait<0>();
  __syncthreads();  // the ring is free: it becomes the merge buffer
  fa4_ts(3);
''')
rep('''  if (a.cluster > 1) {
    if (tid == 0) *sBad = bad != 0;
    arch::cluster_sync();  // every CTA's partial, flag and start visible
    const bool cluster_bad = cluster_merge<kBF16, kD>(a, b, kv_head, row0, rows, sPart, sLse, sBad);
    arch::cluster_sync();  // the peers are done reading this CTA's smem: it may exit
    if (a.num_partials > 1 && arrive_last(a, &s_last, cluster_bad))
      combine_tile<kBF16, kD>(a, b, kv_head, row0, rows);
  } else if (a.num_splits > 1 && arrive_last(a, &s_last, false)) {
    combine_tile<kBF16, kD>(a, b, kv_head, row0, rows);
  }
}''','''  fa4_ts(4);
  if (a.cluster > 1) {
    if (tid == 0) *sBad = bad != 0;
    arch::cluster_sync();  // every CTA's partial, flag and start visible
    fa4_ts(5);
    const bool cluster_bad = cluster_merge<kBF16, kD>(a, b, kv_head, row0, rows, sPart, sLse, sBad);
    fa4_ts(6);
    arch::cluster_sync();  // the peers are done reading this CTA's smem: it may exit
    fa4_ts(7);
    if (a.num_partials > 1 && arrive_last(a, &s_last, cluster_bad)) {
      fa4_ts(8); fa4_ts_val(14, 1);
      combine_tile<kBF16, kD>(a, b, kv_head, row0, rows);
    } else fa4_ts(8);
  } else if (a.num_splits > 1 && arrive_last(a, &s_last, false)) {
    fa4_ts(8); fa4_ts_val(14, 1);
    combine_tile<kBF16, kD>(a, b, kv_head, row0, rows);
  } else fa4_ts(8);
  __syncthreads();
  fa4_ts(9);
}''')
open(f,'w').write(s)
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
