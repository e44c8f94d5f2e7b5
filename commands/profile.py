"""`python -m mlperf profile`: where each phase's time goes on this machine, against its roof."""
from commands.options import run_defaults


def main(args):
    """Where each phase's time goes on this machine: a forward of every phase the roofline costs, profiled by kind
    of operator and set against its roof; then the SUTs' own decode step and cycle against those bare forwards."""
    from mlperf import env
    from mlperf.checkpoint import load_model
    from mlperf.data import load_prompts
    from mlperf.tokenizer import load_tokenizer
    from roofline import peaks
    from roofline.profile import (CONTEXT, SHORT, against, context_cost, linears_by_rows, matvec_streams,
                                  profile_pair, table)
    from mlperf.env import set_threads
    from suts.fast.native import kernels_build
    from suts.registry import build_sut
    run_defaults(args, ("weights", "threads", "max_new_tokens", "gamma"))
    set_threads(args.threads)
    suts = {name: build_sut(name, args.target, args.draft, gamma=args.gamma, weights=args.weights)
            for name in ("baseline", "spec")}
    timed = profile_pair(suts["spec"].target, suts["spec"].draft, args.gamma)
    (roof, listed), note = peaks.judged(  # this hour's peaks, as the phases were timed
        lambda p: (p, against(timed, p)), lambda r: peaks.implausible({x.name: x.fraction_of_roof for x in r[1]}),
        lambda again: peaks.load(max_age_s=0))
    profiles = {p.name.split(" (")[0]: p for p in listed}
    print(f"machine: {env.machine()}; " + ", ".join(f"{k} {v}" for k, v in env.versions().items()))
    print(f"peaks: {peaks.summary(roof)}" + (f"\n({note})" if note else ""))
    paths = [f"{name}'s {model} {runner.choice()}" for name, sut in suts.items()
             for model, runner in zip(("target", "draft"), sut.runners())]
    print(f"fast path: {kernels_build()}; " + "; ".join(paths))
    print("one forward per phase, batch 1, context 256 (prefill: a 200-token prompt); % of the profiled time by kind:")
    print(table(list(profiles.values())))
    added = {name: context_cost(suts["spec"].target, new, roof) for name, new in
             (("decode", 1), (f"verify ({args.gamma + 1} tokens)", args.gamma + 1))}
    print(f"what {CONTEXT - SHORT} more keys add to a forward (context {CONTEXT} against {SHORT}): " + ", ".join(
        f"{name} +{took * 1e3:.3f} ms (+{ideal * 1e3:.3f} at the roofs)" for name, (took, ideal) in added.items())
        + " (attention: each head's keys and values, read after the weights' stream has pushed them out)")
    print_row_costs(suts["spec"].target, args.gamma, roof)
    plain = load_model(args.target)  # unpacked: what torch.compile and the kernels' stream comparison start from
    if args.compile:
        print_compiled(suts["spec"], plain, load_model(args.draft), args.gamma)
    streams = matvec_streams(plain)
    print("one row through the target's linear weights, layer after layer: " + ", ".join(
        f"{name} {bps / 1e9:.1f} GB/s" for name, bps in streams.items()))
    if args.weights != "int8":  # int8 weights run through their own linears, which this packing is not
        by_rows = linears_by_rows(plain, args.weights == "fp16", roof)
        print("the target's linears layer after layer as the SUTs run them, by rows (a verify pass of that many "
              "tokens): " + ", ".join(f"{rows} {s * 1e3:.2f} ms ({100 * f:.0f}% of roof)"
                                      for rows, (s, f) in by_rows.items()))
    print_steps(suts, load_tokenizer(args.target).encode(load_prompts()[0].text)[-200:], args.max_new_tokens, profiles)
    print_caches(suts, args.gamma, roof)


def print_steps(suts: dict, prompt: list[int], tokens: int, profiles: dict) -> None:
    """The baseline's decode step and spec's cycle inside the SUT, against their bare forwards' best times."""
    from roofline.profile import decode_in_forwards
    from suts.fast.step import Tally
    for name, sut in suts.items():
        for runner in sut.runners():
            runner.tally = Tally()
        stats, inside, _ = decode_in_forwards(sut, prompt, tokens)
        print(f"{name}'s fast path over that loop: " + "; ".join(
            f"{role} {runner.tally.summary()}" for role, runner in zip(("target", "draft"), sut.runners())))
        if name == "baseline":
            per, step, what = stats.steps, stats.decode_s / stats.steps, "decode step"
            bare = profiles["decode"].seconds
        else:
            per, step, what = stats.cycles, (stats.draft_s + stats.verify_s) / stats.cycles, "cycle"
            bare = stats.drafted / stats.cycles * profiles["draft step"].seconds + profiles["verify"].seconds
        if inside is None:
            print(f"{name} {what} in the SUT: {step * 1e3:.3f} ms, its bare forwards {bare * 1e3:.3f} ms "
                  f"({100 * (step - bare) / step:.0f}% outside them: sampling, acceptance, the loop)")
            continue
        forwards = inside / per
        print(f"{name} {what} in the SUT: {step * 1e3:.3f} ms, {forwards * 1e3:.3f} of it in its forwards "
              f"({100 * (step - forwards) / step:.0f}% outside them: sampling, acceptance, the loop); the bare "
              f"forwards above {bare * 1e3:.3f} ms, timed at their best (the run's "
              f"{100 * (forwards / bare - 1):+.0f}%: its contexts, and the spells below)")


def print_caches(suts: dict, gamma: int, roof: dict) -> None:
    """What the machine's spells and its caches do to a step: the decode step many times in a row, a step's
    bookkeeping warm and cold, the draft's chain straight after itself and after a verify pass."""
    from roofline import peaks
    from roofline.analytic import phase_costs
    from roofline.profile import CONTEXT, PROMPT
    from roofline.spells import against_a_read, bookkeeping_s, draft_chain_s, spells
    from suts.fast.packed import weight_bytes
    s = spells(suts["baseline"].target)
    print(f"the decode step at context {CONTEXT}, {s.steps} times in a row: p10 {s.percentiles[10]:.3f}, median "
          f"{s.percentiles[50]:.3f}, p90 {s.percentiles[90]:.3f} ms; the median of {s.span} steps in a row from "
          f"{s.spans[0]:.3f} to {s.spans[1]:.3f} ms (one step's time against the next's: correlation "
          f"{s.correlation:.2f}): this machine's spells, which a run's mean step inherits and a best-of timing does "
          "not")
    turns = against_a_read(suts["baseline"].target)
    print(f"the decode step at context {CONTEXT} in turns with a plain read of its {turns.bytes / 1e6:.0f} MB, "
          f"{turns.pairs} times: the read's time over the step's (the step's fraction of a memory roof measured in the "
          f"same spell) p10 {turns.fractions[10]:.2f}, median {turns.fractions[50]:.2f}, p90 {turns.fractions[90]:.2f}")
    warm, cold = bookkeeping_s(suts["baseline"].target)
    print(f"a step's bookkeeping in tensors, as a sampled step keeps it (ids to a tensor, argmax to a list, a cache's "
          f"length set; a greedy step's ids and argmaxes go through ctypes buffers instead): {warm * 1e6:.0f} us "
          f"straight after itself, {cold * 1e6:.0f} us right after a decode forward (its weights' stream evicts "
          "the interpreter's data from the caches)")
    target, draft = suts["spec"].target, suts["spec"].draft
    warm, cold = draft_chain_s(target, draft, gamma)
    costs = phase_costs(target.config, PROMPT, CONTEXT, draft.config, gamma, draft_weight_bytes=weight_bytes(draft),
                        target_weight_bytes=weight_bytes(target))
    in_cycle = peaks.draft_roofline_s(costs, roof, gamma)
    print(f"the draft's chain of {gamma} steps: {warm * 1e3:.3f} ms straight after itself, {cold * 1e3:.3f} ms right "
          f"after a verify pass (whose stream evicts the draft's weights: {warm / gamma * 1e3:.3f} against "
          f"{cold / gamma * 1e3:.3f} ms a step, {100 * in_cycle * gamma / cold:.0f}% of a step's roof in a "
          f"cycle, {in_cycle * 1e3:.3f} ms: each step's bytes read as fast as the caches give them back)")



def print_row_costs(target, gamma: int, roof: dict) -> None:
    """What each row of a batch adds to the target's greedy step, as the batch sweep's rows (roofline.profile's
    row_costs), for a decode step and a verify pass."""
    import pandas as pd
    from commands.sweep import BATCHES
    from roofline.profile import CONTEXT, row_costs
    steps = {"decode": 1, f"verify ({gamma + 1} tokens)": gamma + 1}
    table = pd.concat({name: row_costs(target, new, BATCHES, roof) for name, new in steps.items()}, axis=1)
    print(f"a batch's greedy step at context {CONTEXT}, by rows: what a row adds, at the roofs (its arithmetic in "
          "full, its logits and attention) and beyond them (the cost a row the batching model fits at batch 2 and "
          "holds fixed):")
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(table.to_string())


def print_compiled(sut, target, draft, gamma: int) -> None:
    """`profile --compile`: every phase's forward through torch.compile against the SUTs' eager one, or one line
    saying why torch.compile could not run here."""
    from roofline.profile import compile_phase, phases
    print("torch.compile (inductor, frozen weights) of the plain models against the SUTs' eager forwards:")
    for (name, eager, context, new), (_, plain, _, _) in zip(phases(sut.target, sut.draft, gamma),
                                                             phases(target, draft, gamma)):
        try:
            c = compile_phase(name, eager, plain, context, new)
        except Exception as e:  # no C++ compiler, an operator inductor cannot lower: the eager figures stand
            print(f"  torch.compile is unavailable here ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            return
        print(f"  {name}: eager {c.eager_s * 1e3:.3f} ms, compiled {c.compiled_s * 1e3:.3f} ms "
              f"({c.eager_s / c.compiled_s:.2f}x; first call {c.compile_s:.1f} s; max |logit diff| {c.max_diff:.1e})")
