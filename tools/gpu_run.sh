#!/usr/bin/env bash
# One command for a GPU session: the GPU tests, calibration, the micro and models
# suites, everything under ONE folder, resumable, safe to start detached and poll.
#
#   bash tools/gpu_run.sh [STEP ...]          run the steps (default: all, in priority order)
#   bash tools/gpu_run.sh status              where the run stands (steps done, current step, log tail)
#   bash tools/gpu_run.sh pack FILE.tgz       tar the results folder (compile caches and, unless
#                                             PACK_TRACES=1, Chrome traces left out)
#   bash tools/gpu_run.sh list                the steps and what each runs
#
# On the lent machines (10 min per command, machine given back 30 s after a call):
#   call 1:  (setsid nohup bash tools/gpu_run.sh > /tmp/gpu_run.out 2>&1 &); sleep 540; \
#            bash tools/gpu_run.sh status; bash tools/gpu_run.sh pack $OUT/r.tgz
#   call 2+ (at once): sleep 560; bash tools/gpu_run.sh status; bash tools/gpu_run.sh pack $OUT/r.tgz
# With 15 minutes of device time a session (2026-12-03: start-up, every call and idle wait count),
# there is one full call: name the steps (`env models-18 models-check`: models-check took 176 s on
# the H200 on 2026-11-30, models-18 has never finished a run) and keep ~1 min for the pack.
# A step that finished writes STEPS/<step>.done and is skipped when the script runs again;
# bench steps share one results.json and continue it (--resume), so a run cut off by a
# fresh machine continues where it stopped (copy the folder back first, or start over).
#
# Runs from source: PYTHONPATH=src, TRITON_INTERPRET=0, python3 (torch, Triton, transformers
# preinstalled; no package index).  Results: $GPU_RUN_DIR, default
# bench/results/<gpu>-<yyyy-mm-dd>/ (the name is kept in /tmp/stitchml_gpu_run_dir so a
# poll after midnight finds the same folder):
#   env.txt            nvidia-smi, driver, versions, commit
#   tests/pytest.log   tests/junit.xml       `pytest -m gpu`
#   calibrate.log                            `stitchml calibrate`
#   bench/results.{json,md} + PNGs           every bench step, one report
#   logs/<step>.log    run.log    STATUS
set -u
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0
PY=${PY:-python3}
POINTER=/tmp/stitchml_gpu_run_dir
# GPU_RUN_QUICK=1: a CPU rehearsal of the runner itself (bench --quick under the Triton
# interpreter; GPU tests skip); it writes to GPU_RUN_DIR, never to bench/results/.
QUICK=()
if [ "${GPU_RUN_QUICK:-0}" = 1 ]; then
    export TRITON_INTERPRET=1
    QUICK=(--quick --reps 2 --no-plots)
    : "${GPU_RUN_DIR:?GPU_RUN_QUICK=1 needs GPU_RUN_DIR}"
fi

gpu_tag() {
    local name
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z' 'a-z')
    for t in h200 h100 a100 l40 a10; do
        case "$name" in *"$t"*) echo "$t"; return;; esac
    done
    echo "${name:+gpu}${name:-nogpu}" | tr -cd 'a-z0-9'
}

results_dir() {   # $1 = create: make a new folder when there is none yet
    if [ -n "${GPU_RUN_DIR:-}" ]; then echo "$GPU_RUN_DIR"; return; fi
    if [ -s "$POINTER" ] && [ -d "$(cat "$POINTER")" ]; then cat "$POINTER"; return; fi
    [ "${1:-}" = create ] || return 1
    local d="bench/results/$(gpu_tag)-$(date -u +%Y-%m-%d)"
    mkdir -p "$d" && echo "$PWD/$d" > "$POINTER" && echo "$PWD/$d"
}

CORE_MODELS=(--case bert_train --case bert_infer --case gpt2_train --case llama8_train)
REST_MODELS=(--case gpt2_decode --case llama_block_train --case llama_block_infer --case dien_train --case dien_infer)
MODEL_CONTENDERS=(--contender eager --contender inductor --contender inductor-ro --contender stitchml
                  --contender stitchml-nograph)
MICRO_CONTENDERS=(--contender eager --contender inductor --contender stitchml)

# name | timeout (s) | what (for `list`)
# Priority order (forty-ninth session; a lent machine gives ~12 minutes of run): issue 18's rows
# first (never measured: three sessions ran out of time before them), then the training rows
# against Inductor with and without CUDA graphs, the micro rows with open predictions, the GPU
# tests (46 passed on 2026-11-30), the issue-18 A/B variants, compile time (its own step and
# folder: a --resume would otherwise keep the steady-state rows and skip the cold-compile
# measurement), the later predictions
STEP_ORDER=(env models-18 models-check micro-check tests models-18-ab pdl compile-check dien models-15 trace ncu small-cols calibrate models-bf16 variants micro-bf16 compile micro-fp32 models-fp32 models-rest micro-extra)
declare -A LIMIT=([env]=120 [tests]=900 [calibrate]=900 [micro-bf16]=2400 [micro-fp32]=2400
                  [models-bf16]=3600 [models-fp32]=3600 [models-rest]=3600 [micro-extra]=3600
                  [compile]=2400 [compile-check]=900 [variants]=1200 [models-15]=1800 [models-18]=1800 [models-18-ab]=1800 [dien]=1200 [trace]=600 [ncu]=600 [small-cols]=600 [models-check]=900 [micro-check]=600 [pdl]=900)
declare -A WHAT=(
    [env]="nvidia-smi, driver, torch/Triton versions, git commit -> env.txt"
    [tests]="pytest -m gpu tests (judged against float64) -> tests/"
    [calibrate]="stitchml calibrate (copy bandwidth, launch cost, ...) -> calibrate.log"
    [micro-bf16]="micro suite bf16: eager, inductor, stitchml; every row CUDA-graph replayed; device time"
    [micro-fp32]="micro suite fp32: same"
    [models-bf16]="BERT train b16/infer b1,b16, GPT-2 train b8 s512, LLaMA-style 8L train b4 s1024, bf16: wall, GPU busy, host/step, launches; eager, inductor, inductor-ro, stitchml, stitchml-nograph"
    [compile]="cold compile (empty caches) and warm-cache compile in a fresh process: BERT and LLaMA-style training, bf16, inductor vs stitchml -> compile/"
    [trace]="profiler traces (host + device) of BERT and LLaMA-style training steps, bf16, stitchml and inductor-ro: GPU idle gaps and the host work in them, CUDA-graph replay state, host time by function -> trace/; BERT inference b1 without CUDA graphs, stitchml-nograph and inductor: host time by function -> trace-host/"
    [compile-check]="the short compile check (issue 14): cold call on empty caches and a warm fresh process, BERT-base and LLaMA-style training, bf16, Inductor's default and stitchml, 20 timed reps -> compile-check/"
    [pdl]="programmatic dependent launch A/B (forty-third session, runtime/pdl.py): BERT and LLaMA-style training and ResNet-50 training (issue18_resnet50), bf16, CUDA graphs; stitchml and stitchml-pdl (knob pdl=auto) in one run -> pdl/"
    [models-check]="the training rows (BERT, GPT-2, LLaMA-style; bf16) against Inductor with and without its CUDA graphs (inductor-ro, inductor, stitchml): the short check of a runtime change -> models-check/"
    [ncu]="Nsight Compute counters (speed of light, occupancy, warp stalls, memory) of stitch's and Inductor's kernels on the BERT-shaped column reductions (2048 x 768, bf16) -> ncu.txt; of the training steps' stitched kernels that lost most against their prediction in models-check (tools/worst_kernels.py) -> ncu-models.txt"
    [small-cols]="the BERT-shaped column reductions (column_sum_tokens, layer_norm_bwd_tokens: 2048 x 768, bf16): eager, inductor, stitchml, then stitchml under mapping knob variants (and tuple_reductions on these and layer_norm N=1024) -> small-cols/"
    [micro-check]="the micro rows with open predictions, bf16 (BERT-shaped column sums and layer-norm backward, batch_sum, the N=32768 norms and softmax, the stem max-pool, the BERT-base AdamW step): eager, inductor, stitchml -> bench/; then stitchml alone on those and layer_norm_bwd / rms_norm_bwd N=1024, column_sum 32768 x 1024 (default), and on the walks over row blocks with prefetch_rows=0 (noprefetch) and partial_programs_per_sm=4 (pp4) (forty-eighth session); layer/RMS norm backward N=1024 and N=4096 against Inductor too, and with narrow_walks=0 (nonarrow: their 16-warp walks as before, forty-ninth session) -> micro-check/; the N=32768 norms and softmax in both dtypes with prefetch_columns on and off -> micro-check-colpf/"
    [models-15]="issue 15's rows, bf16: BERT-base train and infer at b32 s128, the LLaMA-style 8-layer step with vocabulary 128256 (peak memory of its loss); eager, inductor, inductor-ro, stitchml -> bench/"
    [models-fp32]="the same rows in fp32"
    [models-18]="issue 18's rows, bf16: ResNet-50 training (channels_last, b32, 224 px), Swin-T training (b32), a small Mixtral-style MoE decoder's training step (b8 s512); inductor-ro, stitchml -> bench/ (never measured before the forty-ninth session: first after env)"
    [models-18-ab]="the A/B variants of issue 18's rows, stitchml alone: ResNet-50 with STITCHML_NARROW_WALKS=0 (16-warp walks without prefetch, as before the forty-ninth session) -> bench-resnet-nonarrow/, with STITCHML_BN_CHUNK_STATS=0 STITCHML_LAYOUT_COLUMNS=0 (the batch-norm statistics a row per channel, as before the thirty-fifth session) -> bench-rows-per-channel/, with STITCHML_BN_CHUNK_STATS=1 STITCHML_CHAINED_COLUMNS=1 (the thirty-ninth session's chunk statistics, off by default) -> bench-bn-chunks/, and with STITCHML_BN_SHIFT_SAMPLE=1 (the shift a pass over the whole batch, as before the thirty-seventh) -> bench-bn-whole-shift/; MoE with STITCHML_PLACE_CATS=0 (the expert backward's concatenation computed by one kernel from the parts' sources, as in the thirty-seventh session) -> bench-moe-no-placement/, and with STITCHML_CAT_PARTS=0 STITCHML_PLACE_CATS=0 (copied, as before) -> bench-cat-parts-off/; Swin-T with STITCHML_PARTIAL_SEGMENTS=0 (no row segments beside column partials, as before the forty-first session) -> bench-swin-no-segments/"
    [dien]="DIEN's training step (b2048, 50 steps), bf16 (thirty-eighth session: buffer placement, the folded bias sums and weight-gradient products): inductor-ro, stitchml -> bench/; stitchml with STITCHML_PLACE_CATS=0 STITCHML_REDUCTION_SUMS=0 -> bench-dien-no-placement/, with STITCHML_PRODUCT_SUMS=0 -> bench-dien-no-product-fold/"
    [models-rest]="GPT-2 decode, LLaMA 7B-size block train/infer, DIEN train/infer, both dtypes; eager, inductor, stitchml"
    [micro-extra]="micro suite, both dtypes: max-autotune and jax"
    [variants]="knob variants on the norm-backward and column-sum micro rows, bf16, one process: defaults, no grid barriers, 8 partial programs per SM, 8192-element looped partials, no looped partials (persistent rows then), column partials at 16 bytes a thread (the old tiles), blocks not scaled by dtype, long rows without a persistent grid, no transposed tiles, 8192-column loop blocks, chunk statistics for long layer-norm rows -> variants/; BERT, GPT-2 and LLaMA-style training steps under model knobs (GEMM epilogues forced on and off among them) -> variants-models/"
)

run_step() {
    # bench over the shared results folder; every step continues it
    # GPU_RUN_BENCH_ARGS: more bench options for every bench step (e.g. "--reps 50"; word-split)
    # shellcheck disable=SC2206
    local BENCH=("$PY" -m stitchml.cli bench --out "$R/bench" --resume --no-progress "${QUICK[@]}"
                 ${GPU_RUN_BENCH_ARGS:-})
    case "$1" in
    env)
        # the device's copy of the tree may have no .git: the caller passes GPU_RUN_COMMIT
        { date -u; nvidia-smi; echo "commit ${GPU_RUN_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"
          git status --short 2>/dev/null | head -50
          "$PY" -c "import torch, triton, sys; print('python', sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda); print('triton', triton.__version__); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO CUDA')"
          "$PY" -c "import transformers; print('transformers', transformers.__version__)" 2>&1
        } > "$R/env.txt" 2>&1
        [ "${GPU_RUN_QUICK:-0}" = 1 ] && return 0
        "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || return 1
        # a fresh machine has no calibration: seed the newest committed one of this device and
        # these versions (plans then match the earlier runs'); the
        # calibrate step, when run, replaces it
        "$PY" - <<'PYEOF' 2>&1 | tee -a "$R/env.txt"
import json, shutil
from pathlib import Path
from stitchml.plan.devices import calibration_path, current_device, _versions
dev = current_device()
dest = calibration_path(dev.name)
tv, rv = _versions()
if dest.exists():
    print(f"calibration: {dest} (already there)")
else:
    found = sorted((p for p in Path("bench/results").glob("*/calibration.json")
                    if (lambda d: (d.get("name"), d.get("torch"), d.get("triton")) == (dev.name, tv, rv))(json.loads(p.read_text()))),
                   key=lambda p: p.parent.name)
    if found:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(found[-1], dest)
        print(f"calibration: seeded from {found[-1]}")
    else:
        print(f"calibration: none committed for {dev.name} torch {tv} triton {rv}: table figures")
PYEOF
        ;;
    tests)
        # a hung test must not eat the session: per-test limit where pytest-timeout is there
        local TO=(); "$PY" -c "import pytest_timeout" 2>/dev/null && TO=(--timeout 420)
        "$PY" -m pytest -m gpu tests -q -p no:cacheprovider -rfEs "${TO[@]}" --junitxml="$R/tests/junit.xml" \
            > "$R/tests/pytest.log" 2>&1
        local rc=$?; tail -5 "$R/tests/pytest.log"
        # failures are results, not a reason to stop the run: the step is done once pytest ran
        [ $rc -le 1 ] ;;
    calibrate)
        "$PY" -m stitchml.cli calibrate > "$R/calibrate.log" 2>&1; local rc=$?; tail -20 "$R/calibrate.log"
        local f; f=$("$PY" -c "from stitchml.plan.devices import calibration_path, current_device
print(calibration_path(current_device().name))" 2>/dev/null)
        [ -n "$f" ] && [ -f "$f" ] && cp "$f" "$R/calibration.json"
        return $rc ;;
    micro-bf16) "${BENCH[@]}" --suite micro --dtype bf16 "${MICRO_CONTENDERS[@]}" ;;
    micro-fp32) "${BENCH[@]}" --suite micro --dtype fp32 "${MICRO_CONTENDERS[@]}" ;;
    models-bf16) "${BENCH[@]}" --suite models --dtype bf16 --no-compile-time "${CORE_MODELS[@]}" "${MODEL_CONTENDERS[@]}" ;;
    models-fp32) "${BENCH[@]}" --suite models --dtype fp32 --no-compile-time "${CORE_MODELS[@]}" "${MODEL_CONTENDERS[@]}" ;;
    micro-check)
        # the rows with open predictions (bench/NOTES.md, twenty-eighth session: column lanes
        # on BERT-shaped column partials), eager, inductor, stitchml; then stitchml with the
        # knob off in the same process
        # (thirtieth session: rows of 32768 held whole in registers, `persistent_max_cols`;
        # forty-seventh: held whole by default where they fit, `nolong` the looped form)
        local MC=(--case 'column_sum_tokens[2048x768]' --case 'layer_norm_bwd_tokens[2048x768]'
                  --case 'batch_sum[8x512x768]' --case 'layer_norm_fwd[N=32768]' --case 'rms_norm_fwd[N=32768]'
                  --case 'softmax_fwd[N=32768]' --case 'softmax_bwd[N=32768]'
                  --case 'max_pool_fwdbwd[32x64x112x112,cl]'   # (thirty-sixth session: 62 µs predicted)
                  --case 'adamw_foreach[bert_base]'    # (forty-sixth session: in-place optimizer step)
                  --case 'bias_gelu_bwd_tokens[2048x3072]'    # (forty-eighth: BERT's GELU backward walk)
                  --case 'layer_norm_bwd[N=1024]' --case 'rms_norm_bwd[N=1024]'   # (forty-ninth: walks narrowed to
                  --case 'layer_norm_bwd[N=4096]' --case 'rms_norm_bwd[N=4096]')  #  prefetch, narrow_walks)
        local ROWS='column_sum_tokens[2048x768];layer_norm_bwd_tokens[2048x768];layer_norm_bwd[N=1024];column_sum[32768x1024]'
        local LONG='layer_norm_fwd[N=32768];rms_norm_fwd[N=32768];softmax_fwd[N=32768];softmax_bwd[N=32768]'
        local OPT='adamw_foreach[bert_base]'
        # (forty-eighth session: walks over row blocks with the next block's loads issued first)
        local WALK='column_sum_tokens[2048x768];layer_norm_bwd_tokens[2048x768];layer_norm_bwd[N=1024];rms_norm_bwd[N=1024];column_sum[32768x1024];bias_gelu_bwd_tokens[2048x3072]'
        # (forty-ninth session: 16-warp walks planned at 8 warps, or one program an SM, to prefetch)
        local NARROW='layer_norm_bwd[N=1024];rms_norm_bwd[N=1024];layer_norm_bwd[N=4096];rms_norm_bwd[N=4096];column_sum[32768x1024]'
        local COLPF='layer_norm_fwd[N=32768];layer_norm_bwd[N=32768];softmax_fwd[N=32768];softmax_bwd[N=32768]'
        if [ "${GPU_RUN_QUICK:-0}" = 1 ]; then   # (their --quick sizes)
            NARROW='column_sum_tokens[40x24]' COLPF='softmax_fwd'
            MC=(--case 'column_sum_tokens[40x24]' --case 'layer_norm_bwd_tokens[16x24]' --case 'batch_sum[2x8x24]'
                --case 'max_pool_fwdbwd[2x8x12x12,cl]' --case 'adamw_foreach[tiny]')
            ROWS='column_sum_tokens[40x24];layer_norm_bwd_tokens[16x24]' LONG='softmax_fwd' OPT='adamw_foreach[tiny]'
            WALK=$ROWS
        fi
        "${BENCH[@]}" --suite micro --dtype bf16 "${MC[@]}" "${MICRO_CONTENDERS[@]}" || return $?
        "$PY" -m stitchml.tools.bench_variants --out "$R/micro-check" "${QUICK[@]:0:1}" \
            --variant "default::$ROWS;$LONG;$OPT;rms_norm_bwd[N=1024];layer_norm_bwd[N=4096];rms_norm_bwd[N=4096]" --variant "noprefetch:prefetch_rows=0:$WALK" \
            --variant "pp4:partial_programs_per_sm=4:$WALK" \
            --variant "nonarrow:narrow_walks=0:$NARROW" || return $?
        # (forty-ninth session) persistent looped walks with prefetched column loops: rows of 32768,
        # float32 (and the bf16 layer-norm backward's), against the knob off
        "$PY" -m stitchml.tools.bench_variants --out "$R/micro-check-colpf" "${QUICK[@]:0:1}" --dtype both \
            --variant "default::$COLPF" --variant "nocolpf:prefetch_columns=0:$COLPF" || return $?
        # the walk latency the cost model uses (`stitchml calibrate`'s figure, alone; stores nothing)
        "$PY" -m stitchml.tools.calibrate --walk-only > "$R/micro-check/walk_latency.txt" 2>&1 ;;
        # (column lanes, combine spread, long rows held whole and the AdamW sibling refusal were
        # measured three, three, two and one times against their knob off: nocolwarps, nospread,
        # nolong, serial in bench/results/h200-2026-11-30-b/micro-check; dropped for device time)
    models-15) "${BENCH[@]}" --suite models --dtype bf16 --no-compile-time --case 'issue15_*' \
                   --contender eager --contender inductor --contender inductor-ro --contender stitchml ;;
    models-18) "${BENCH[@]}" --suite models --dtype bf16 --no-compile-time --case 'issue18_*' \
                   --contender inductor-ro --contender stitchml ;;   # (eager runs as the reference anyway)
    models-18-ab)
        # (forty-ninth session) ResNet-50 with its batch-norm statistics walks as before: 16-warp
        # tiles without prefetch (narrow_walks off; predicted 245 us more a step than the default)
        STITCHML_NARROW_WALKS=0 "$PY" -m stitchml.cli bench --out "$R/bench-resnet-nonarrow" --resume \
            --no-progress "${QUICK[@]}" --suite models --dtype bf16 --no-compile-time --case issue18_resnet50 \
            --contender stitchml || return $?
        # the plan before the thirty-fifth session's layout change, for the A/B of its prediction:
        # batch-norm statistics as one row per channel (bench/NOTES.md, thirty-fifth session)
        STITCHML_BN_CHUNK_STATS=0 STITCHML_LAYOUT_COLUMNS=0 "$PY" -m stitchml.cli bench --out "$R/bench-rows-per-channel" --resume \
            --no-progress "${QUICK[@]}" --suite models --dtype bf16 --no-compile-time --case issue18_resnet50 \
            --contender stitchml || return $?
        # the thirty-ninth session's chunk statistics on (off by default: three launches a batch norm, not
        # five, but an issue floor ~15x the partials'), then the shift over the whole batch (three reads of x)
        STITCHML_BN_CHUNK_STATS=1 STITCHML_CHAINED_COLUMNS=1 "$PY" -m stitchml.cli bench --out "$R/bench-bn-chunks" --resume \
            --no-progress "${QUICK[@]}" --suite models --dtype bf16 --no-compile-time --case issue18_resnet50 \
            --contender stitchml || return $?
        STITCHML_BN_CHUNK_STATS=0 STITCHML_BN_SHIFT_SAMPLE=1 "$PY" -m stitchml.cli bench --out "$R/bench-bn-whole-shift" --resume \
            --no-progress "${QUICK[@]}" --suite models --dtype bf16 --no-compile-time --case issue18_resnet50 \
            --contender stitchml || return $?
        # the MoE step with the expert backward's concatenation computed by its own kernel (knob
        # place_cats off: the thirty-seventh session's plan), then copied again (cat_parts off too)
        STITCHML_PLACE_CATS=0 "$PY" -m stitchml.cli bench --out "$R/bench-moe-no-placement" --resume \
            --no-progress "${QUICK[@]}" --suite models --dtype bf16 --no-compile-time --case issue18_moe \
            --contender stitchml || return $?
        STITCHML_CAT_PARTS=0 STITCHML_PLACE_CATS=0 "$PY" -m stitchml.cli bench --out "$R/bench-cat-parts-off" \
            --resume --no-progress "${QUICK[@]}" --suite models --dtype bf16 --no-compile-time --case issue18_moe \
            --contender stitchml || return $?
        # Swin-T without the forty-first session's row segments beside column partials (its GELU
        # backward in [8, 512] tiles with a quarter of the lanes masked, as before)
        STITCHML_PARTIAL_SEGMENTS=0 "$PY" -m stitchml.cli bench --out "$R/bench-swin-no-segments" --resume \
            --no-progress "${QUICK[@]}" --suite models --dtype bf16 --no-compile-time --case issue18_swin_t \
            --contender stitchml ;;
    dien)
        "${BENCH[@]}" --suite models --dtype bf16 --no-compile-time --case dien_train \
                   --contender inductor-ro --contender stitchml || return $?
        STITCHML_PLACE_CATS=0 STITCHML_REDUCTION_SUMS=0 "$PY" -m stitchml.cli bench \
            --out "$R/bench-dien-no-placement" --resume --no-progress "${QUICK[@]}" --suite models --dtype bf16 \
            --no-compile-time --case dien_train --contender stitchml || return $?
        STITCHML_PRODUCT_SUMS=0 "$PY" -m stitchml.cli bench --out "$R/bench-dien-no-product-fold" --resume \
            --no-progress "${QUICK[@]}" --suite models --dtype bf16 --no-compile-time --case dien_train \
            --contender stitchml ;;
    compile)
        "$PY" -m stitchml.cli bench --out "$R/compile" --resume --no-progress "${QUICK[@]}" \
            --suite models --dtype bf16 --case bert_train --case llama8_train \
            --contender inductor --contender stitchml ;;
    compile-check)
        "$PY" -m stitchml.cli bench --out "$R/compile-check" --resume --no-progress "${QUICK[@]}" --reps 20 \
            --suite models --dtype bf16 --case bert_train --case llama8_train \
            --contender inductor --contender stitchml ;;
    trace)
        "$PY" -m stitchml.tools.step_trace --case bert_train --case llama8_train --dtype bf16 \
            --contender stitchml --contender inductor-ro --out "$R/trace" "${QUICK[@]:0:1}" || return $?
        # the host path without CUDA graphs (issue 12): BERT inference b1 is host-bound for
        # every contender (2026-11-27: stitch 5.86 ms of host a step, Inductor 3.47, with
        # fewer launches); its cProfile table says by what
        local B1='bert_infer[b1,s128]'; [ "${GPU_RUN_QUICK:-0}" = 1 ] && B1='bert_infer[b1,s8]'
        "$PY" -m stitchml.tools.step_trace --case "$B1" --dtype bf16 --steps 2 --profile-steps 50 \
            --contender stitchml-nograph --contender inductor --out "$R/trace-host" "${QUICK[@]:0:1}" ;;
    pdl)
        # the next kernel's launch overlapping the previous one's tail: predicted ~0.5-1 us a stitched
        # kernel that follows another stitched kernel (bench/NOTES.md, forty-third session)
        "$PY" -m stitchml.cli bench --out "$R/pdl" --resume --no-progress "${QUICK[@]}" ${GPU_RUN_BENCH_ARGS:-} \
            --suite models --dtype bf16 --no-compile-time --case bert_train --case llama8_train \
            --case issue18_resnet50 --contender stitchml --contender stitchml-pdl ;;
    models-check)
        "$PY" -m stitchml.cli bench --out "$R/models-check" --resume --no-progress "${QUICK[@]}" ${GPU_RUN_BENCH_ARGS:-} \
            --suite models --dtype bf16 --no-compile-time --case bert_train --case gpt2_train --case llama8_train \
            --contender inductor-ro --contender inductor --contender stitchml ;;   # (issue 12: >= 1.1x Inductor's default)
    ncu)
        # why BERT's column-partial kernels took ~30 µs where ~4 were predicted (bench/NOTES.md,
        # 2026-11-27): hardware counters of the same kernels in the micro cases of that shape
        [ "${GPU_RUN_QUICK:-0}" = 1 ] && { echo "ncu: GPU only, skipped in a CPU rehearsal"; return 0; }
        local NCU; NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        # (one run per contender: Inductor's launches came first and took all 24 of one
        # run on 2026-11-28)
        local c; : > "$R/ncu.txt"
        for c in stitchml inductor; do
            "$NCU" --target-processes all -k 'regex:^(k_|triton_)' --launch-count 12 \
                --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                --section MemoryWorkloadAnalysis --section SchedulerStats \
                "$PY" -m stitchml.cli bench --suite micro --case 'column_sum_tokens[2048x768]' --case 'layer_norm_bwd_tokens[2048x768]' \
                --dtype bf16 --contender "$c" --reps 3 --no-plots --no-progress \
                --out "$R/ncu-bench-$c" >> "$R/ncu.txt" 2>&1
        done
        local rc=$?; tail -5 "$R/ncu.txt"
        # the same counters on the stitched kernels of the training steps that lost most
        # against their prediction in this run's models-check profile (names are content
        # hashes: picked from the measurement, not typed in)
        local SLOW; SLOW=$("$PY" -m stitchml.tools.worst_kernels "$R/models-check/results.json" --top 8 --regex 2>/dev/null)
        [ -n "$SLOW" ] || { echo "ncu: no models-check profile in $R (run that step first): kernels of the steps skipped"; return $rc; }
        echo "ncu: the steps' kernels $SLOW"
        "$NCU" --target-processes all -k "regex:$SLOW" --launch-count 16 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section SchedulerStats \
            "$PY" -m stitchml.tools.step_trace --case bert_train --case llama8_train --case gpt2_train --dtype bf16 \
            --contender stitchml --steps 1 --out "$R/ncu-models" > "$R/ncu-models.txt" 2>&1
        tail -5 "$R/ncu-models.txt"
        return $rc ;;
    small-cols)
        local SMALL='column_sum_tokens[2048x768];layer_norm_bwd_tokens[2048x768]'
        local LNF='layer_norm_fwd[N=1024];layer_norm_bwd[N=1024]'
        local CASES=(--case 'column_sum_tokens[2048x768]' --case 'layer_norm_bwd_tokens[2048x768]')
        if [ "${GPU_RUN_QUICK:-0}" = 1 ]; then   # (their --quick sizes)
            SMALL='column_sum_tokens[40x24];layer_norm_bwd_tokens[16x24]' LNF='layer_norm_fwd[N=1000]'
            CASES=(--case 'column_sum_tokens[40x24]' --case 'layer_norm_bwd_tokens[16x24]')
        fi
        "${BENCH[@]}" --suite micro --dtype bf16 "${CASES[@]}" "${MICRO_CONTENDERS[@]}" || return $?
        "$PY" -m stitchml.tools.bench_variants --out "$R/small-cols" "${QUICK[@]:0:1}" \
            --variant "default::$SMALL;$LNF" \
            --variant "pp1:partial_programs_per_sm=1:$SMALL" \
            --variant "pp8:partial_programs_per_sm=8:$SMALL" \
            --variant "blk1k:block_elems=1024:$SMALL" \
            --variant "blk16k:block_elems=16384:$SMALL" \
            --variant "pb16:partial_bytes_per_thread=0:$SMALL" \
            --variant "nobarrier:global_barriers=0:$SMALL" \
            --variant "tuple:tuple_reductions=1:$SMALL;$LNF" ;;
    models-rest) "${BENCH[@]}" --suite models --dtype both "${REST_MODELS[@]}" \
                     --contender eager --contender inductor --contender stitchml ;;
    micro-extra) "${BENCH[@]}" --suite micro --dtype both --contender max-autotune --contender jax ;;
    variants)
        # the mapping choices the H200 questioned (bench/NOTES.md), each against the default
        # in the same process: stitchml only (Inductor's rows are in micro-bf16)
        local NORMS='layer_norm_bwd[N=1024];rms_norm_bwd[N=1024];rms_norm_bwd[N=32768];layer_norm_bwd[N=32768]'
        local SOME='layer_norm_bwd[N=1024];rms_norm_bwd[N=32768]' LONG='rms_norm_bwd[N=32768]' Q=()
        local COLS='column_sum[32768x1024]' TR='layer_norm_bwd[N=32768]' CE='cross_entropy_fwdbwd[V=32000];cross_entropy_fwdbwd[V=50257]'
        local ROWS='softmax_fwd[N=32768];softmax_bwd[N=32768];cross_entropy_fwdbwd[V=32000];cross_entropy_fwdbwd[V=50257]'
        local FWD='layer_norm_fwd[N=1024];rms_norm_fwd[N=1024];softmax_fwd[N=1024];layer_norm_fwd[N=4096];bias_gelu[8192x4096]'
        local LONGROWS='layer_norm_fwd[N=32768];rms_norm_fwd[N=32768];softmax_fwd[N=32768];softmax_bwd[N=32768]'
        local LV='layer_norm_fwd[N=32768];layer_norm_bwd[N=32768]'
        if [ "${GPU_RUN_QUICK:-0}" = 1 ]; then   # (quick sizes have other names: whole families)
            NORMS='layer_norm_bwd;rms_norm_bwd' SOME=$NORMS LONG='rms_norm_bwd' COLS='column_sum' TR='layer_norm_bwd' CE='cross_entropy_fwdbwd'
            ROWS='softmax_fwd;cross_entropy_fwdbwd' FWD='layer_norm_fwd;bias_gelu' LONGROWS='softmax_bwd' LV='layer_norm_fwd' Q=(--quick)
        fi
        "$PY" -m stitchml.tools.bench_variants --out "$R/variants" "${Q[@]}" \
            --variant "default::$NORMS;$COLS;$ROWS;$FWD;$LONGROWS" \
            --variant "nobarrier:global_barriers=0:$NORMS" \
            --variant "pp8:partial_programs_per_sm=8:$SOME" \
            --variant "el8k:looped_partial_elems=8192,partial_lanes=0:$LONG" \
            --variant "nolanes:partial_lanes=0:$LONG" \
            --variant "nopart:looped_partials=0:$LONG" \
            --variant "pb16:partial_bytes_per_thread=0:$COLS" \
            --variant "unscaled:dtype_scaled_blocks=0:$FWD" \
            --variant "nopersist:persistent_rows=0:$LONGROWS" \
            --variant "notall:transposed_tiles=0:$TR" \
            --variant "lbc8k:loop_block_cols=8192:$ROWS" \
            --variant "flatrows:row_values=0:$CE" \
            --variant "rowmasks:exact_rows=0:$ROWS;$FWD" \
            --variant "noalign:align_rows=0:$CE" \
            --variant "chunkvar:split_long_variance=1:$LV"
        # model steps: the default against knobs off (bert: the attention bias gradients'
        # merge; gpt2: the aligned loss rows, the compact embedding gradient), stitchml only,
        # in one process
        "$PY" -m stitchml.tools.bench_variants --out "$R/variants-models" --suite models "${Q[@]}" \
            --variant "default::bert_train;gpt2_train" \
            --variant "nocolwarps:partial_column_warps=0:bert_train;gpt2_train" \
            --variant "nospread:combine_spread=0:bert_train;gpt2_train" \
            --variant "noreuse:reuse_outputs=0:bert_train" \
            --variant "nomos:multi_output_siblings=0:bert_train" \
            --variant "noalign:align_rows=0:gpt2_train" \
            --variant "noemb:compact_embedding_grads=0:gpt2_train" \
            --variant "tuple:tuple_reductions=1:bert_train;gpt2_train" \
            --variant "epi_on:gemm_epilogue=on:bert_train" \
            --variant "epi_off:gemm_epilogue=off:bert_train" \
            --variant "default::llama8_train" \
            --variant "notall:transposed_tiles=0:llama8_train" \
            --variant "epi_on:gemm_epilogue=on:llama8_train" \
            --variant "epi_off:gemm_epilogue=off:llama8_train" ;;
    *) echo "unknown step $1 (bash tools/gpu_run.sh list)"; return 2 ;;
    esac
}

status() {
    echo "results: $R"
    echo "done: $(cd "$R/STEPS" && ls 2>/dev/null | sed 's/\.done$//' | tr '\n' ' ')"
    [ -f "$R/STATUS" ] && cat "$R/STATUS"
    echo "--- run.log (tail)"; tail -n 15 "$R/run.log" 2>/dev/null
    local cur; cur=$(sed -n 's/^running: \([^ ]*\).*/\1/p' "$R/STATUS" 2>/dev/null)
    [ -n "$cur" ] && { echo "--- logs/$cur.log (tail)"; tail -n 8 "$R/logs/$cur.log" 2>/dev/null; }
    return 0
}

case "${1:-}" in
    status|pack|__step)
        R=$(results_dir) || { echo "no run yet (nothing in \$GPU_RUN_DIR or $POINTER)"; exit 1; } ;;
esac
case "${1:-}" in
    status) status; exit 0 ;;
    __step) run_step "$2"; exit $? ;;      # one step, in its own process (under `timeout`)
    pack)
        dest=${2:?pack FILE.tgz}
        # (Chrome traces can be tens of MB, over what a device call brings back in one file:
        # left out unless PACK_TRACES=1; their summaries, trace/step_trace.md, always go)
        EXTRA=(); [ "${PACK_TRACES:-0}" = 1 ] || EXTRA=(--exclude='*.json.gz')
        tar czf "$dest" --exclude=compile-caches "${EXTRA[@]}" -C "$(dirname "$R")" "$(basename "$R")" && ls -l "$dest"
        exit $? ;;
    list)
        for s in "${STEP_ORDER[@]}"; do printf '%-12s %5ss  %s\n' "$s" "${LIMIT[$s]}" "${WHAT[$s]}"; done
        exit 0 ;;
esac

STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=("${STEP_ORDER[@]}")
for s in "${STEPS[@]}"; do
    [ -n "${LIMIT[$s]:-}" ] || { echo "unknown step $s; steps: ${STEP_ORDER[*]}"; exit 2; }
done
if [ "${GPU_RUN_QUICK:-0}" != 1 ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU visible to $PY: nothing run (GPU_RUN_QUICK=1 GPU_RUN_DIR=... rehearses on a CPU)"; exit 4
fi
R=$(results_dir create)
mkdir -p "$R/STEPS" "$R/logs" "$R/tests" "$R/bench"

# one runner at a time per results folder
exec 9>"$R/.lock"
if ! flock -n 9; then echo "another gpu_run.sh is running on $R (bash tools/gpu_run.sh status)"; exit 3; fi

exec > >(tee -a "$R/run.log") 2>&1
echo "=== $(date -u +%FT%TZ) gpu_run.sh ${STEPS[*]} in $R"
for s in "${STEPS[@]}"; do
    if [ -f "$R/STEPS/$s.done" ]; then echo "--- $s: done before, skipped"; continue; fi
    rm -rf "$R/bench/compile-caches"            # left by a row that was cut off
    echo "running: $s since $(date -u +%FT%TZ) (limit ${LIMIT[$s]:-600} s)" > "$R/STATUS"
    echo "--- $(date -u +%T) $s: ${WHAT[$s]:-?}"
    t0=$(date +%s)
    timeout --kill-after=30 "${LIMIT[$s]}" bash "$0" __step "$s" > "$R/logs/$s.log" 2>&1
    rc=$?
    tail -n 4 "$R/logs/$s.log"
    if [ $rc -eq 0 ]; then
        echo "$(date -u +%FT%TZ) $(( $(date +%s) - t0 )) s" > "$R/STEPS/$s.done"
        echo "--- $(date -u +%T) $s done in $(( $(date +%s) - t0 )) s"
    else
        echo "--- $(date -u +%T) $s FAILED (exit $rc$([ $rc -eq 124 ] && echo ': time limit')); run again to retry/resume"
    fi
done
echo "finished: ${STEPS[*]} at $(date -u +%FT%TZ)" > "$R/STATUS"
echo "=== $(date -u +%FT%TZ) finished"
