#!/usr/bin/env bash
# The training smoke tests on a one-GPU box, each step a real `ultra3` job under the gpu-box profile (local
# executor, this machine's python3 with the wheel set of scripts/gpu/carry.py on its path):
#   pretrain  pretrain -c tiny: 40 iterations on the blend of `ultra3 data prep pretrain -c tiny --run gpu-box`
#             (the newest pretrain-data artifact), checkpoints at iterations 20 and 40
#   resume    the same run with train.train_iters=60: it loads iteration 40 and trains 20 more
#   phases    pretrain -c tiny_phases: the two-phase run, iterations 0-30 on the tiny blend and 30-40 on the
#             tiny_phase2 blend (`ultra3 data prep pretrain -c tiny_phase2 --run gpu-box`), phase 2 started by the
#             launcher in the same job from phase 1's checkpoint at iteration 30 (its own checkpoint dir)
#   sft       sft -c tiny from that checkpoint on the packed data of `ultra3 data prep sft -c tiny --run gpu-box`
#   quantize  quantize -c tiny of the SFT checkpoint (NVFP4 with ModelOpt) into a Hugging Face checkpoint
#   convert   the round trip: convert hf-to-megatron -c tiny (a made tiny Hugging Face checkpoint into Megatron-Bridge),
#             then convert megatron-to-hf -c tiny of that checkpoint back to Hugging Face, each gated by logit parity
#   eval      eval -c tiny of the SFT checkpoint and of its quantization, then `nemotron jobs compare` of the two
#   again     pretrain and sft once more (a new checkpoint dir), with the compile cache the steps before filled: their
#             first iteration without Triton's autotuning (<step>.again.log)
#   rl        rl rlvr -c tiny: 3 GRPO steps from the SFT checkpoint, colocated on the GPU (NeMo RL from the source
#             trees `scripts/gpu/carry.py rl-stage` unpacked in $ULTRA3_SMOKE_RL, default /opt/ultra3-rl, put ahead
#             on PYTHONPATH); `data prep rl -c tiny` first when the store has no rl-data artifact
# Every training step uses the compile cache $ULTRA3_SMOKE_CACHE (default /tmp/ultra3-smoke/compile-cache), emptied
# when the pretrain step starts, so the first pretrain is cold.
# The data preps run where Ray is (any CPU machine, `--run gpu-box` there too); carry their output dirs and
# $NEMORUN_HOME/artifacts to the same paths here.
#
# usage: scripts/gpu/smoke.sh OUT [STEP ...]     (default: all, in order; a failed step stops the rest,
#        unless ULTRA3_SMOKE_KEEP_GOING=1)
# Writes OUT/<step>.log, OUT/<step>.memory.csv (nvidia-smi memory.used, MiB, every 200 ms) and
# OUT/versions.json, then prints benchmarks/gpu_smoke.py's table and writes OUT/loss.png. Triton prints each
# autotuning it does (TRITON_PRINT_AUTOTUNING=1 unless set): the table sums them per step.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/gpu/smoke.sh OUT [pretrain|resume|phases|sft|quantize|convert|eval|again|rl ...]}
shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(pretrain resume phases sft quantize convert eval again rl)
for step in "${steps[@]}"; do
    case $step in pretrain | resume | phases | sft | quantize | convert | eval | again | rl) ;; *)
        echo "unknown step $step (pretrain, resume, phases, sft, quantize, convert, eval, again, rl)" >&2; exit 2 ;;
    esac
done

mkdir -p "$out"
export TRITON_PRINT_AUTOTUNING=${TRITON_PRINT_AUTOTUNING:-1}
env_file=${ULTRA3_ENV_FILE:-env.toml.example}
checkpoints=${ULTRA3_SMOKE_CHECKPOINTS:-/tmp/ultra3-smoke/pretrain-checkpoints}
converted=${ULTRA3_SMOKE_CONVERTED:-/tmp/ultra3-smoke/convert}  # the round trip's two outputs, new each run
cache=${ULTRA3_SMOKE_CACHE:-/tmp/ultra3-smoke/compile-cache}
rl_root=${ULTRA3_SMOKE_RL:-/opt/ultra3-rl}  # the NeMo RL source trees (carry.py rl-stage)

python3 - "$out/versions.json" <<'EOF'
import importlib.metadata as md, json, shutil, subprocess, sys
smi = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
gpu = subprocess.run(smi, capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else None
names = ["torch", "transformer-engine", "transformer-engine-torch", "megatron-core", "megatron-bridge", "mamba-ssm",
         "causal-conv1d", "nvidia-modelopt", "transformers", "triton", "ray", "ultra3-launcher"]
packages = {}
for name in names:
    try:
        packages[name] = md.version(name)
    except md.PackageNotFoundError:
        packages[name] = None
import torch
json.dump({"gpu": gpu, "python": sys.version.split()[0], "cuda": torch.version.cuda, "packages": packages},
          open(sys.argv[1], "w"), indent=1)
EOF

failed=0
for step in "${steps[@]}"; do
    second=()  # a second command of the step, run when the first succeeds
    jobenv=()  # the step's own environment
    case $step in
        pretrain) rm -rf "$cache"
            argv=(pretrain -c tiny dataset.mock=false "checkpoint.save=$checkpoints") ;;
        resume) argv=(pretrain -c tiny dataset.mock=false "checkpoint.save=$checkpoints" train.train_iters=60) ;;
        phases) rm -rf "$checkpoints-phases"
            argv=(pretrain -c tiny_phases dataset.mock=false "checkpoint.save=$checkpoints-phases") ;;
        sft) argv=(sft -c tiny dataset.mock=false) ;;
        quantize) argv=(quantize -c tiny make_checkpoint=false bf16_checkpoint=null run.gpus_per_node=1) ;;
        convert)
            rm -rf "$converted"
            argv=(convert hf-to-megatron -c tiny "output_dir=$converted/megatron")
            second=(convert megatron-to-hf -c tiny "megatron_checkpoint=$converted/megatron" "output_dir=$converted/hf") ;;
        eval) argv=(eval -c tiny make_checkpoint=false checkpoint=ultra3-sft-checkpoint-tiny:latest)
            second=(eval -c tiny make_checkpoint=false checkpoint=ultra3-quantized-checkpoint-tiny:latest) ;;
        again) rm -rf "$checkpoints-again"  # a new run: loading iteration 40 would train nothing
            argv=(pretrain -c tiny dataset.mock=false "checkpoint.save=$checkpoints-again")
            second=(sft -c tiny dataset.mock=false) ;;
        rl) argv=(rl rlvr -c tiny policy=ultra3-sft-checkpoint-tiny:latest "nemo_rl_dir=$rl_root/RL")
            jobenv=("PYTHONPATH=$(python3 scripts/gpu/carry.py rl-path "$rl_root")${PYTHONPATH:+:$PYTHONPATH}"
                    NEMO_RL_PY_EXECUTABLES_SYSTEM=1)
            dry=$(ultra3 "${argv[@]}" --run gpu-box --env-file "$env_file" --dry-run 2>&1)
            [[ $dry == *"no rl-data artifact"* ]] && second=("${argv[@]}") && argv=(data prep rl -c tiny) ;;
    esac
    case ${argv[0]} in pretrain | sft) argv+=("run.compile_cache=$cache") ;; esac
    case ${second[0]:-} in pretrain | sft) second+=("run.compile_cache=$cache") ;; esac
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$out/$step.memory.csv" 2>/dev/null &
    sampler=$!
    started=$(date +%s)
    echo "== $step: ultra3 ${argv[*]} --run gpu-box"
    log=$out/$step.log
    [ "$step" = again ] && log=$out/pretrain.again.log
    env "${jobenv[@]}" ultra3 "${argv[@]}" --run gpu-box --env-file "$env_file" >"$log" 2>&1
    status=$?
    if [ $status -eq 0 ] && [ ${#second[@]} -gt 0 ]; then
        echo "== $step: ultra3 ${second[*]} --run gpu-box"
        [ "$step" = again ] && log=$out/sft.again.log && : >"$log"
        env "${jobenv[@]}" ultra3 "${second[@]}" --run gpu-box --env-file "$env_file" >>"$log" 2>&1
        status=$?
    fi
    if [ $status -eq 0 ] && [ "$step" = eval ]; then  # the SFT model against its quantization
        mapfile -t results < <(grep -o 'published ultra3-eval-results-[^ ]*' "$log" | cut -d' ' -f2)
        echo "== $step: nemotron jobs compare ${results[*]}"
        nemotron jobs compare "${results[@]}" >>"$log" 2>&1
        status=$?
    fi
    kill "$sampler" 2>/dev/null
    echo "== $step: exit $status after $(($(date +%s) - started)) s"
    if [ $status -ne 0 ]; then
        failed=$status
        tail -n 30 "$log"
        [ "${ULTRA3_SMOKE_KEEP_GOING:-0}" = 1 ] || break
    fi
done
python3 benchmarks/gpu_smoke.py "$out" --plot "$out/loss.png"
exit $failed
