"""What a run record says of its SUT, in brief."""
from scenarios.records import weights_in_brief


def test_weights_in_brief_name_the_targets_then_a_draft_that_differs():
    assert weights_in_brief({"target": "fp16", "draft": "fp16"}) == "fp16"
    assert weights_in_brief({"target": "fp16", "draft": "int8"}) == "fp16/int8"
    assert weights_in_brief({"target": "fp32"}) == "fp32"
    assert weights_in_brief(None) == "-"  # an engine behind an endpoint: its record does not say
