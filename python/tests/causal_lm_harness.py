"""Causal-LM sweep: every causal language model architecture registered in the
installed transformers, built from a small config, on tern against the CPU.

For each model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` the harness makes
a small config (the type's defaults with the sizes shrunk: 2 layers, hidden 64,
4 heads, vocab 256, small experts; no weights are downloaded), builds the
model on the CPU with a fixed seed, and runs forward (logits and the language
modelling loss) and backward on the CPU and on a copy on tern, in eval mode
(no dropout) and float32. Each architecture ends as one of

- ``pass``: logits, loss and every parameter's gradient match the CPU's within
  1e-3 (relative to the largest magnitude of each tensor, as PyTorch's own
  device-versus-CPU tests compare at 1e-3);
- ``mismatch``: tern ran, and some value differs (the worst is named);
- ``error``: tern raised where the CPU did not (the message's first line);
- ``no reference``: the CPU could not build or run the model from a small
  config (not counted: there is nothing to compare with);

and records every operator that went through the CPU fallback on tern. With
``--fallback-error`` the tern runs use ``TORCH_TERN_FALLBACK=error``, so an
architecture passes only when it runs with no fallback at all.

The full sweep writes docs/transformers-sweep.md (about 10 minutes on two
cores):

    .venv/bin/python -P python/tests/causal_lm_harness.py --report docs/transformers-sweep.md

tests/test_causal_lm.py runs the fixed subset SUBSET in the README's test
command.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import io
import logging
import os
import sys
import time
import warnings

if __name__ == "__main__":
    # A private simulated node, before torch (and with it torch_tern) loads.
    os.environ.setdefault("TERN_SIM_NODE", f"causal-lm-{os.getpid()}")
    os.environ.setdefault("TERN_SIM_TOPOLOGY", "1x2x8G")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch_tern  # noqa: E402

TOL = 1e-3

# A fixed, representative subset for the test command: dense decoders of the
# main families, a mixture of experts (integer histc in the router), a
# state-space model, an encoder-decoder's decoder and an encoder used as a
# decoder.
SUBSET = ["gpt2", "llama", "qwen2", "mistral", "mixtral", "qwen2_moe", "gpt_neox", "phi3",
          "falcon", "gemma2", "mamba", "bart", "bert"]

# The sizes every small config gets, where the type's config has the field.
SMALL = {
    # width and depth, under each family's name for them
    "hidden_size": 64, "n_embd": 64, "d_model": 64, "dim": 64, "embed_dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2,
    "decoder_layers": 2, "encoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4,
    "decoder_attention_heads": 4, "encoder_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "kv_channels": 16,
    "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128, "d_ff": 128,
    "vocab_size": 256, "max_position_embeddings": 128, "n_positions": 128, "n_ctx": 128,
    # experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_k": 2, "top_k": 2, "moe_topk": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "expert_intermediate_size": 32,
    # latent attention and state spaces
    "rotary_dim": 8, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16, "state_size": 8, "ssm_state_size": 8, "conv_kernel": 4,
    "mamba_d_state": 8, "mamba_d_conv": 4, "time_step_rank": 8,
    # windows larger than the input, so no model splits it
    "sliding_window": 64, "attention_window": 64,
}
# Mismatches whose cause is known and is not a wrong result on tern (none
# today; afmoe's tied router scores are broken by break_ties).
KNOWN_DIFFERENCES: dict[str, str] = {}

# A model bigger than this is not small: its config has sizes SMALL misses.
MAX_PARAMETERS = 20_000_000
# Seconds one architecture may take on tern and the CPU together.
TIME_LIMIT = 120
SEQUENCE = 12
BATCH = 2


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def small_config(model_type: str):
    """The type's default config with SMALL's sizes where it has those fields,
    in its sub-configs too (a text config inside a multimodal one)."""
    from transformers import CONFIG_MAPPING

    return shrink(CONFIG_MAPPING[model_type])


def shrink(config_class, defaults=None):
    from transformers import PretrainedConfig

    defaults = defaults if defaults is not None else config_class()

    def settable(key: str) -> bool:  # a field, not a property the config derives
        return hasattr(defaults, key) and not isinstance(getattr(config_class, key, None), property)

    overrides = {k: v for k, v in SMALL.items() if settable(k)}
    # Layer patterns sized for the default depth: let the config derive them again.
    for key in ("layer_types", "layers_block_type", "hybrid_override_pattern", "block_types"):
        if settable(key) and isinstance(getattr(defaults, key), (list, str)):
            value = getattr(defaults, key)
            depth = overrides.get("num_hidden_layers", overrides.get("num_layers", 2))
            overrides[key] = value[:depth] if isinstance(value, list) else value
    for key, value in vars(defaults).items():
        if isinstance(value, PretrainedConfig) and settable(key):
            try:
                overrides[key] = shrink(type(value), value).to_dict()
            except Exception:  # noqa: BLE001 - keep the default sub-config
                pass
    # Special tokens of the full vocabulary must exist in the small one.
    vocab = overrides.get("vocab_size", getattr(defaults, "vocab_size", SMALL["vocab_size"]))
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id"):
        value = getattr(defaults, key, None) if settable(key) else None
        if isinstance(value, int) and value >= vocab:
            overrides[key] = vocab - 1 - len(overrides) % 4
        elif isinstance(value, list) and any(isinstance(v, int) and v >= vocab for v in value):
            overrides[key] = [v if v < vocab else vocab - 1 for v in value]
    config = config_class(**overrides)
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "activation_dropout"):
        if hasattr(config, key):
            setattr(config, key, 0.0)
    config.use_cache = False
    return config


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double().cpu(), want.detach().double()
    if got.shape != want.shape:
        return float("inf")
    if want.numel() == 0:
        return 0.0
    both_nan = got.isnan() & want.isnan()
    diff = (got - want).abs().masked_fill(both_nan, 0).max().item()
    if diff != diff:
        return float("inf")
    return diff / max(want.abs().masked_fill(want.isnan(), 0).max().item(), 1e-6)


def run(model, input_ids, labels):
    out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    return out.logits, out.loss


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        previous = logging.getLogger("transformers").level
        logging.getLogger("transformers").setLevel(logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                yield
            finally:
                logging.getLogger("transformers").setLevel(previous)


class ArchitectureTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    """Raises ArchitectureTimeout in the main thread after `seconds` (SIGALRM)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise ArchitectureTimeout(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check(model_type: str, fallback_error: bool = False) -> dict:
    """One architecture on tern against the CPU: a result dict (see the module doc)."""
    start = time.monotonic()
    try:
        with time_limit(TIME_LIMIT):
            return check_unlimited(model_type, fallback_error)
    except ArchitectureTimeout as e:
        return {"model": model_type, "status": "error", "detail": first_line(e), "fallbacks": {},
                "seconds": time.monotonic() - start}


def break_ties(model) -> None:
    """Gives weight matrices that from_config leaves constant small noise.

    afmoe initialises its router to zeros, so every expert's score ties, and
    which of equal scores topk picks is unspecified in PyTorch (the CPU's
    choice follows its selection algorithm, tern takes the lowest positions):
    other experts would be chosen on each side and their gradients compared
    against nothing. A trained model has no such ties. Noise of 0.02 on the
    CPU model, before the tern copy is made, gives both the same weights.
    Vectors (norm weights, biases) are left as they are.
    """
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(torch.randn(p.shape, generator=generator) * 0.02)


def check_unlimited(model_type: str, fallback_error: bool) -> dict:
    from transformers import AutoModelForCausalLM

    result = {"model": model_type, "status": "", "detail": "", "fallbacks": {}, "seconds": 0.0}
    start = time.monotonic()
    try:
        with quiet():
            config = small_config(model_type)
            with torch.device("meta"):
                parameters = sum(p.numel() for p in
                                 AutoModelForCausalLM.from_config(config).parameters())
            if parameters > MAX_PARAMETERS:
                raise ValueError(f"the small config still has {parameters / 1e6:.0f} M parameters "
                                 "(sizes this harness does not know how to shrink)")
            torch.manual_seed(0)
            cpu_model = AutoModelForCausalLM.from_config(config).float().eval()
            break_ties(cpu_model)
            vocab = getattr(cpu_model.config, "vocab_size", None) or SMALL["vocab_size"]
            input_ids = torch.randint(0, min(vocab, SMALL["vocab_size"]), (BATCH, SEQUENCE))
            tern_model = copy.deepcopy(cpu_model)
            cpu_logits, cpu_loss = run(cpu_model, input_ids, input_ids)
    except Exception as e:  # noqa: BLE001 - any failure means no reference
        result.update(status="no reference", detail=first_line(e))
        result["seconds"] = time.monotonic() - start
        return result
    previous_mode = os.environ.get("TORCH_TERN_FALLBACK")
    if fallback_error:
        os.environ["TORCH_TERN_FALLBACK"] = "error"
    torch_tern.clear_op_tracking()
    try:
        with quiet():
            tern_model = tern_model.to("tern")
            ids = input_ids.to("tern")
            tern_logits, tern_loss = run(tern_model, ids, ids)
            errors = {"logits": relative_error(tern_logits, cpu_logits),
                      "loss": relative_error(tern_loss, cpu_loss)}
            cpu_params = dict(cpu_model.named_parameters())
            for name, p in tern_model.named_parameters():
                want = cpu_params[name].grad
                if want is None and p.grad is None:
                    continue
                if want is None or p.grad is None:
                    errors[f"grad {name}"] = float("inf")
                else:
                    errors[f"grad {name}"] = relative_error(p.grad, want)
        worst = max(errors, key=errors.get)
        if errors[worst] <= TOL:
            result.update(status="pass", detail=f"worst {worst} {errors[worst]:.1e}")
        else:
            result.update(status="mismatch", detail=f"{worst}: {errors[worst]:.2e}")
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        result.update(status="error", detail=first_line(e))
    finally:
        if fallback_error:
            if previous_mode is None:
                os.environ.pop("TORCH_TERN_FALLBACK", None)
            else:
                os.environ["TORCH_TERN_FALLBACK"] = previous_mode
    result["fallbacks"] = dict(torch_tern.get_fallback_ops())
    result["seconds"] = time.monotonic() - start
    return result


def first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return text[:200]


def sweep(model_types: list[str], fallback_error: bool = False, verbose: bool = True) -> list[dict]:
    results = []
    for model_type in model_types:
        r = check(model_type, fallback_error)
        results.append(r)
        if verbose:
            fb = ", ".join(f"{k}x{v}" for k, v in sorted(r["fallbacks"].items()))
            print(f"{model_type:28s} {r['status']:12s} {r['seconds']:5.1f}s {r['detail'][:90]}"
                  f"{'  fallback: ' + fb if fb else ''}", flush=True)
        torch.tern.empty_cache()
    return results


def summary(results: list[dict]) -> dict:
    counted = [r for r in results if r["status"] != "no reference"]
    passed = [r for r in counted if r["status"] == "pass"]
    clean = [r for r in counted if r["status"] == "pass" and not r["fallbacks"]]
    ops = collections.Counter()
    for r in counted:
        for op in r["fallbacks"]:
            ops[op] += 1
    return {"architectures": len(results), "with reference": len(counted), "pass": len(passed),
            "no fallback": len(clean), "fallback ops": ops}


def report(results: list[dict], strict: list[dict] | None, path: str, seconds: float) -> None:
    s = summary(results)
    n = max(1, s["with reference"])
    lines = [
        "# transformers causal-LM sweep on tern",
        "",
        "Every causal-LM architecture registered in the installed transformers, built from a",
        "small config (2 layers, hidden 64, vocab 256; no weights downloaded), forward and",
        "backward on tern against the CPU at 1e-3 (python/tests/causal_lm_harness.py, whose",
        "docstring says how each result is counted). Regenerate with:",
        "",
        "```sh",
        ".venv/bin/python -P python/tests/causal_lm_harness.py --report docs/transformers-sweep.md",
        "```",
        "",
        f"torch {torch.__version__}, transformers {__import__('transformers').__version__}; "
        f"the sweep took {seconds / 60:.1f} minutes.",
        "",
        f"- architectures: {s['architectures']}; with a CPU reference from a small config: "
        f"{s['with reference']}",
        f"- pass (forward and backward within 1e-3): {s['pass']} of {s['with reference']} "
        f"({100 * s['pass'] / n:.0f}%)",
        f"- pass with no CPU fallback at all: {s['no fallback']} of {s['with reference']} "
        f"({100 * s['no fallback'] / n:.0f}%)",
    ]
    if strict is not None:
        t = summary(strict)
        lines.append(f"- with `TORCH_TERN_FALLBACK=error`: {t['pass']} of {t['with reference']} "
                     f"pass ({100 * t['pass'] / max(1, t['with reference']):.0f}%)")
    lines += ["", "## The fallbacks, by how many architectures take them", "",
              "| operator | architectures |", "|---|---|"]
    for op, count in s["fallback ops"].most_common():
        lines.append(f"| `{op}` | {count} |")
    lines += ["", "## Every architecture", "",
              "| model type | result | detail | CPU fallbacks (calls) |", "|---|---|---|---|"]
    for r in results:
        fb = ", ".join(f"`{k}` {v}" for k, v in sorted(r["fallbacks"].items()))
        detail = r["detail"].replace("|", "\\|")
        if r["status"] == "mismatch" and r["model"] in KNOWN_DIFFERENCES:
            detail += f" (known: {KNOWN_DIFFERENCES[r['model']]})"
        lines.append(f"| {r['model']} | {r['status']} | {detail} | {fb} |")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model types (default: every causal LM)")
    parser.add_argument("--subset", action="store_true", help="only the test command's subset")
    parser.add_argument("--fallback-error", action="store_true",
                        help="run tern with TORCH_TERN_FALLBACK=error")
    parser.add_argument("--report", help="write the markdown report here (runs both modes)")
    args = parser.parse_args()
    types = args.models or (SUBSET if args.subset else causal_lm_types())
    start = time.monotonic()
    results = sweep(types, fallback_error=args.fallback_error and not args.report)
    strict = None
    if args.report:
        print("== again with TORCH_TERN_FALLBACK=error", flush=True)
        strict = sweep([r["model"] for r in results if r["status"] != "no reference"],
                       fallback_error=True)
        report(results, strict, args.report, time.monotonic() - start)
    s = summary(results)
    print(f"{s['pass']} of {s['with reference']} pass, {s['no fallback']} with no fallback "
          f"({s['architectures']} architectures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
