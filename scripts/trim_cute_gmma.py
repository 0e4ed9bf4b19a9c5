#!/usr/bin/env python3
"""Writes trimmed copies of CuTe's SM90 GMMA headers, for a shorter compile of the Hopper kernels.

CuTe's wgmma headers define every instruction shape for every type pair (f16/bf16/tf32/int8/fp8
inputs, f16/f32/int32 accumulators, dense and sparse): about 190,000 of the 370,000 lines a
forward kernel's translation unit parses, most of the front end's time. fa4's kernels use dense
64xNx16 wgmma with f32 accumulation of bf16 or fp16 inputs only. This script copies the eight
GMMA headers into an overlay directory that the build puts before CuTe's own include directory;
in the copies every other instruction struct keeps its name and template header but gets an empty
body (CuTe's op selectors name every shape, so each must stay a complete type), and every other
MMA_Traits specialisation is dropped. A kernel that instantiated a dropped shape would fail to
compile (no MMA_Traits for it), never run different code: the kept structs are CuTe's text, byte
for byte.

Usage: trim_cute_gmma.py CUTLASS_INCLUDE_DIR OUT_DIR   (writes OUT_DIR/cute/{arch,atom}/...)
The output is rewritten only when its content changes (no needless rebuilds). Prints the headers
it read, one per line (CMake re-runs the configuration when one of them changes).
"""
import os
import re
import sys

# The instruction structs fa4 instantiates: dense, f32 accumulator, bf16 x bf16 or fp16 x fp16.
KEEP = re.compile(r"64x\d+x16_F32(BF16BF16|F16F16)_(SS|RS)\b")

HEADERS = [
    "cute/arch/mma_sm90_gmma.hpp", "cute/arch/mma_sm90_gmma_ext.hpp",
    "cute/arch/mma_sm90_gmma_sparse.hpp", "cute/arch/mma_sm90_gmma_sparse_ext.hpp",
    "cute/atom/mma_traits_sm90_gmma.hpp", "cute/atom/mma_traits_sm90_gmma_ext.hpp",
    "cute/atom/mma_traits_sm90_gmma_sparse.hpp", "cute/atom/mma_traits_sm90_gmma_sparse_ext.hpp",
]

STRUCT = re.compile(r"^struct ((?:MMA|GMMA)_64x\w+)\s*$")          # an instruction definition
TRAITS = re.compile(r"^struct MMA_Traits<\s*(?:SM90::GMMA::SPARSE::)?(\w+)<")  # its traits


def block_end(lines, i):
    """Index of the line `};` that closes the struct whose `{` is at or after line i."""
    depth = 0
    opened = False
    for j in range(i, len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        opened = opened or "{" in lines[j]
        if opened and depth == 0:
            if not lines[j].rstrip().endswith("};"):
                raise ValueError(f"line {j + 1}: struct does not end with '}};'")
            return j
    raise ValueError(f"line {i + 1}: unterminated struct")


def template_start(lines, i):
    """Index of the `template <` line that opens the declaration whose `struct` is line i."""
    j = i - 1
    while j >= 0 and not lines[j].startswith("template"):
        if lines[j].strip().startswith(("struct", "};", "#")):
            raise ValueError(f"line {i + 1}: no template header before the struct")
        j -= 1
    if j < 0:
        raise ValueError(f"line {i + 1}: no template header before the struct")
    return j


def trim(text):
    lines = text.split("\n")
    out = []
    i = 0
    kept = dropped = 0
    while i < len(lines):
        line = lines[i]
        struct, traits = STRUCT.match(line), TRAITS.match(line)
        m = struct or traits
        if not m:
            out.append(line)
            i += 1
            continue
        end = block_end(lines, i)
        if KEEP.search(m.group(1)):
            out.extend(lines[i:end + 1])
            kept += 1
        elif struct:
            out.append(line.rstrip() + " {};")  # the name stays (a complete, empty type)
            dropped += 1
        else:  # a traits specialisation goes with its template header (already copied)
            del out[len(out) - (i - template_start(lines, i)):]
            dropped += 1
        i = end + 1
    return "\n".join(out), kept, dropped


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    for rel in HEADERS:
        path = os.path.join(src, rel)
        with open(path) as f:
            text = f.read()
        try:
            trimmed, kept, dropped = trim(text)
        except ValueError as e:
            sys.exit(f"trim_cute_gmma.py: {path}: {e} (CuTe changed its layout: update the script)")
        if dropped == 0:
            sys.exit(f"trim_cute_gmma.py: {path}: nothing trimmed (CuTe changed its layout: update the script)")
        out = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        old = None
        if os.path.exists(out):
            with open(out) as f:
                old = f.read()
        if old != trimmed:
            with open(out, "w") as f:
                f.write(trimmed)
        print(path)


if __name__ == "__main__":
    main()
