#!/usr/bin/env bash
# Makes tests/convert/data/llama_kquants.gguf, the K-quant test file of tests/convert/test_gguf_read.py: a random
# LlamaForCausalLM (hidden 256, 2 layers: K-quant blocks are 256 wide) written F32 by llama.cpp's
# convert_hf_to_gguf.py, then quantized by llama.cpp's compiled llama-quantize with one K type per kind of tensor:
# attn_q Q2_K, attn_k Q3_K, attn_v Q4_K, attn_output Q5_K, ffn_* Q6_K, the embedding and output Q4_K.
# llama.cpp is the one vendored by the llama-cpp-python 0.3.36 source distribution (its commit is in
# vendor/llama.cpp there); building llama-quantize takes about half an hour on 2 cores.
#   bash tests/convert/data/make_kquants_gguf.sh [WORK_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
work=${1:-$(mktemp -d)}
python=$root/.venv/bin/python
cd "$work"
[ -f llama_cpp_python-0.3.36.tar.gz ] || $python -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d .
[ -d llama_cpp_python-0.3.36 ] || tar xzf llama_cpp_python-0.3.36.tar.gz
llama=$work/llama_cpp_python-0.3.36/vendor/llama.cpp
if [ ! -x "$llama/build/bin/llama-quantize" ]; then
  cmake -S "$llama" -B "$llama/build" -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF -DCMAKE_BUILD_TYPE=Release
  cmake --build "$llama/build" --target llama-quantize -j 2
fi
cd "$root"
$python - "$work/hf" <<'PY'
import sys
from tests.convert import hf_models
hf_models.llama_style(sys.argv[1], "llama", hidden_size=256, intermediate_size=256, seed=7)
PY
$python -c "
import json, sys
from tests.convert import gguf_models
gguf_models.convert([{'source': sys.argv[1], 'out': sys.argv[2], 'type': 'f32'}])
" "$work/hf" "$work/f32.gguf"
"$llama/build/bin/llama-quantize" --tensor-type attn_q=q2_k --tensor-type attn_k=q3_k --tensor-type attn_v=q4_k \
  --tensor-type attn_output=q5_k --tensor-type ffn=q6_k --token-embedding-type q4_k --output-tensor-type q4_k \
  "$work/f32.gguf" "$root/tests/convert/data/llama_kquants.gguf" Q4_K_M
ls -l "$root/tests/convert/data/llama_kquants.gguf"
