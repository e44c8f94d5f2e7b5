import numpy as np
import torch

from training.data import Data
from training.evaluate import HEADING, card_prompts, heldout_loss, with_section


def test_card_prompts_start_and_end_on_line_breaks():
    text = b"".join(b"line %d of the held-out file\n" % i for i in range(400))
    data = Data(np.zeros(10, np.uint16), np.frombuffer(text, np.uint8).astype(np.uint16), bytes, ord("\n"), "byte", "")
    prompts = card_prompts(data)
    assert len(prompts) == 3 and len({tuple(p) for p in prompts}) == 3
    for p in prompts:
        text = bytes(p).decode()
        assert text.startswith("line ") and text.endswith("file\n") and 100 < len(p) <= 200


def test_heldout_loss_of_a_uniform_model_is_log_vocab(tiny_model):
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.zero_()
    data = np.random.default_rng(0).integers(0, 61, 1000).astype(np.uint16)
    assert abs(heldout_loss(tiny_model, data, 5, 32) - np.log(61)) < 1e-4


def test_the_evaluation_section_is_replaced_not_repeated():
    card = "# m\n\n| a | b |\n\n" + HEADING + "\n\nold\n\n## Loss history\n\n| 1 |\n"
    new = with_section(card, HEADING + "\n\nnew\n")
    assert new == "# m\n\n| a | b |\n\n" + HEADING + "\n\nnew\n\n## Loss history\n\n| 1 |\n"
    assert with_section(new, HEADING + "\n\nnewer\n").count(HEADING) == 1
    assert with_section("# m\n", HEADING + "\n\nx\n") == "# m\n\n" + HEADING + "\n\nx\n"
