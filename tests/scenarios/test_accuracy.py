"""The accuracy checker's reference cache (the gate itself runs end to end in test_run)."""
import json

from scenarios.accuracy import reference_outputs
from scenarios.records import RunConfig


def test_a_reference_cache_that_does_not_parse_is_rebuilt(tiny_pair, tmp_path, capsys):
    cfg = RunConfig(target=str(tiny_pair / "target"), max_new_tokens=4)
    prompts = [[1, 2, 3], [4, 5]]
    first = reference_outputs(cfg, prompts, tmp_path)
    (cached,) = tmp_path.glob("*.json")
    for corrupt in ("[[1, 2", json.dumps([[1, 2, 3, 4]]), json.dumps([None, [1]])):  # cut short, too few, wrong type
        cached.write_text(corrupt)
        assert reference_outputs(cfg, prompts, tmp_path) == first
        assert json.loads(cached.read_text()) == first
    assert "computing the baseline's reference outputs again" in capsys.readouterr().err
