"""`python -m mlperf run` and `accuracy`: one LoadGen test, its summary table and roofline printed; accuracy and
compliance are gates (GateFailed: exit 1), and an INVALID performance run fails its verdict too."""
import json

from commands.exits import GateFailed, VerdictFailed
from commands.options import run_config




def main(args):
    """Run one LoadGen test (SUT x scenario x mode) and print LoadGen's summary and a short table; find-peak
    searches the Server's highest VALID QPS, compliance runs TEST06; accuracy and compliance are gates; --engine
    starts the peer engine it names for the test, and stops it after."""
    from commands.peers import engine
    with engine(run_config(args)) as cfg:
        run_test(cfg)


def run_test(cfg):
    """`main`'s test, on settings whose SUT is serving (a peer engine started)."""
    from commands.peak import find_peak
    from commands.peer_build import note_in_record
    from reports.loadgen import headline
    from roofline.analysis import Roofline, write_sidecar
    from scenarios import compliance
    from scenarios.records import RunRecord
    from scenarios.run import run
    from serving.hosts import open_sut
    from suts.fast.threads import describe
    if cfg.mode == "find-peak":
        print(f"results: {find_peak(cfg)}")
        return
    run_dir = run(cfg, (compliance.LAYER,) if cfg.mode == "compliance" else (), explain=write_sidecar,
                  open_sut=open_sut)
    if cfg.engine:  # a peer engine's run: how `make peers` built it
        note_in_record(run_dir)
    print(f"\nresults: {run_dir}")
    for key, value in headline(run_dir).labelled().items():
        print(f"  {key:16s} {value:.3f}" if isinstance(value, float) else f"  {key:16s} {value}")
    if (run_dir / "roofline.json").is_file():
        roof = Roofline.load(run_dir)
        phases, *speculative = roofline_lines(roof)
        print(f"{ROOFLINE_HEADER} {phases}")
        print(f"{roof.tokens_per_s:.1f} tokens/s of SUT time"
              + (f" (LoadGen: {roof.loadgen_tokens_per_s:.1f})" if roof.loadgen_tokens_per_s else ""))
        for line in speculative:
            print(f"speculative: {line} (vs {roof.baseline})")
        for note in (roof.no_baseline, roof.peaks_note):
            if note:
                print(f"note: {note}")
    record = RunRecord.load(run_dir)
    if record.speculative:
        print(f"acceptance: {acceptance_line(record.speculative)}")
    if overhead := (record.endpoint or {}).get("http_overhead_ms"):
        print(f"HTTP's share of each request (this client's token times less the server engine's, "
              f"{overhead['requests']} requests): first token p50 {overhead['first token p50']:.2f}, "
              f"p99 {overhead['first token p99']:.2f} ms; last token p50 {overhead['last token p50']:.2f}, "
              f"p99 {overhead['last token p99']:.2f} ms")
    if record.fused_threads:
        print(f"fast path's threads (of {record.torch_threads}) by call size: {describe(record.fused_threads)}")
    if cfg.mode == "accuracy":  # scored before the run was published
        result = json.loads((run_dir / "accuracy.json").read_text())
        print((run_dir / "accuracy.txt").read_text(), end="")
        if not result["passed"]:
            raise GateFailed(f"accuracy: {'; '.join(result['failures'])}")
    if cfg.mode == "compliance":
        result = json.loads((run_dir / "compliance.json").read_text())
        print((run_dir / "compliance.txt").read_text(), end="")
        if not result["passed"]:
            raise GateFailed(f"TEST06: {result['failures'][0]} ({len(result['failures'])} failures, see {run_dir})")
    if cfg.mode == "performance" and record_validity(run_dir) == "INVALID":
        raise VerdictFailed(f"INVALID: LoadGen judged the run invalid ({run_dir / 'mlperf_log_summary.txt'} says why)")


def acceptance_line(disclosed: dict) -> str:
    """A speculative run's acceptance as engines report it, from its record's disclosure; a synthetic run says so."""
    per_position = ", ".join("-" if r is None else f"{r:.2f}" for r in disclosed["conditional_acceptance"])
    line = (f"mean length {disclosed['mean_acceptance_length']:.2f} tokens a cycle; conditional per draft position "
            f"{per_position}; cycles accepting 0, 1, ... drafts: {disclosed['accepted_per_cycle']}")
    if disclosed.get("synthetic_acceptance"):
        line += (f" ({disclosed['synthetic_acceptance']}, set: the mechanism measured, not the drafter's "
                 "quality)")
    return line


def record_validity(run_dir) -> str:
    """LoadGen's VALID or INVALID for a performance run."""
    from scenarios.logs import read_detail
    return read_detail(run_dir).get("result_validity", "")


ROOFLINE_HEADER = "roofline per phase (ms, FLOP/byte, % of roof, regime; on a GPU, the launch floor):"


def roofline_lines(roof) -> list[str]:
    """How a run's roofline (roofline.analysis.Roofline) prints: its phases on one line, then its speculative
    figures if it has them."""
    lines = ["; ".join(f"{p} {v.seconds * 1e3:.2f} ms (batch {v.batch}), {v.intensity:.1f}, "
                       f"{100 * v.fraction_of_roof:.0f}%, {v.regime}" + (
                           f", {v.launch_floor_s * 1e3:.2f} ms launch floor ({v.seconds / v.launch_floor_s:.1f}x)"
                           if v.launch_floor_s else "") for p, v in roof.phases.items())]
    if roof.speculative:
        sp = roof.speculative
        lines.append(f"alpha {sp.alpha:.3f} (tested drafts), draft acceptance rate {sp.acceptance_rate:.3f}, "
                     f"tokens/cycle {sp.tokens_per_cycle:.2f} measured, {sp.expected_tokens_per_cycle:.2f} at "
                     f"alpha if drafts were accepted independently; c {sp.draft_cost_ratio:.3f}, verify "
                     f"{sp.verify_cost_ratio:.2f} steps; decode speedup: {sp.predicted_speedup:.2f}x predicted (from "
                     f"the acceptance per draft position), measured {sp.measured_speedup:.2f}x, "
                     f"{sp.ceiling_speedup:.2f}x at the roof (a cycle {sp.roof_cycle_steps:.2f} decode steps there)")
    return lines


def accuracy(args):
    """Score an accuracy-mode run directory (exact match vs baseline, log-likelihood, tokens per sample); a gate."""
    from scenarios import accuracy
    result = accuracy.check(args.run_dir)
    print(open(f"{args.run_dir}/accuracy.txt").read(), end="")
    if not result["passed"]:
        raise GateFailed(f"accuracy: {'; '.join(result['failures'])}")
