"""`python -m mlperf defaults`: the defaults a user meets, printed from the code as Markdown, so that the guide's
table (docs/running.md, "Defaults") is this output and never a copy that drifts from it."""
from commands.smoke import GATE, PROMPTS, ROUNDS, TOKENS
from mlperf.devices import default_dtype
from mlperf.files import read_text
from mlperf.model import GEOMETRIES
from scenarios.config import RunConfig
from scenarios.scenario import SERVER_TOKEN_BUDGET, Scenario
from scenarios.settings import PROFILES, model_name, resolve
from suts.drafting import GAMMA
from suts.fast.step import WEIGHTS

PROFILE_KEYS = {"min_duration": "min duration (ms)", "min_query_count": "min queries",
                "target_latency_percentile": "judged at (percentile)", "ttft_latency": "TTFT limit (ms)",
                "tpot_latency": "TPOT limit (ms)", "target_qps": "load (QPS)"}


def dtype_name(device: str) -> str:
    return str(default_dtype(device)).removeprefix("torch.")


def run_defaults() -> list[tuple[str, str, str]]:
    """(setting, default, what it is) for the settings every run has."""
    cfg = RunConfig()
    return [("SUT", cfg.sut, "`--sut`, `SUT=`"), ("scenario", cfg.scenario, "`--scenario`, `SCENARIO=`"),
            ("mode", cfg.mode, "`--mode`, `MODE=`"), ("profile", cfg.profile, "`--profile`, `PROFILE=`"),
            ("gamma", str(GAMMA), "draft tokens a speculative cycle, `--gamma`, `GAMMA=`"),
            ("weights", WEIGHTS, "what the CPU's kernels stream, `--weights`"),
            ("dtype", f"{dtype_name('cpu')} on a CPU, {dtype_name('cuda')} on CUDA", "activations, `--dtype`"),
            ("max batch", str(cfg.max_batch), "Offline and Server rows decoding together, `--max-batch`, "
                                              "`MAX_BATCH=` (SingleStream: 1)"),
            ("token budget", f"{SERVER_TOKEN_BUDGET} in Server, whole prompts in Offline",
             "tokens a scheduler iteration takes, `--token-budget`, `TOKEN_BUDGET=`"),
            ("new tokens", str(cfg.max_new_tokens), "a sample's at most, `--max-new-tokens`"),
            ("temperature", f"{cfg.temperature:g} (greedy)", "`--temperature`"),
            ("threads", "half the cores", "torch's, `--threads`"),
            ("stall timeout (s)", f"{cfg.stall_timeout_s:g}", "`--stall-timeout`"),
            ("smoke gate", f"{GATE}", "spec's decode tokens/s over the baseline's at least this, `--gate`, `GATE=`"),
            ("smoke load", f"{ROUNDS} rounds of {PROMPTS} prompts x {TOKENS} tokens",
             "`--rounds`, `--samples`, `--max-new-tokens`")]


def profile_rows(model: str) -> list[list[str]]:
    """Per profile and scenario, the user.conf values it sets for `model` (a LoadGen model name)."""
    rows = []
    for profile, path in PROFILES.items():
        text = read_text(path)
        for scenario in Scenario.known.values():
            values = resolve(text, model, scenario.settings_name, str(path))
            rows.append([profile, scenario, *(values.get(k, "-") for k in PROFILE_KEYS)])
    return rows


def markdown() -> str:
    """Both tables, as docs/running.md holds them."""
    lines = ["| setting | default | what it is |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {what} |" for name, value, what in run_defaults()]
    model = model_name(GEOMETRIES["target"])
    lines += ["", f"The profiles' LoadGen settings for the shipped target (LoadGen model `{model}`):", "",
              "| profile | scenario | " + " | ".join(PROFILE_KEYS.values()) + " |",
              "|---|---|" + "---|" * len(PROFILE_KEYS)]
    lines += ["| " + " | ".join(row) + " |" for row in profile_rows(model)]
    return "\n".join(lines) + "\n"


def main(args) -> None:
    print(markdown(), end="")
