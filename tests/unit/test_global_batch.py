"""A resume keeps its checkpoint's global batch (micro_batch_size x grad_accum x world size) on another world size
or micro_batch_size, grad_accum following; a world size that cannot split it is refused with the ones that can;
a train.grad_accum given on the command line is used as given, and a global batch it changes is said."""

import pytest

from blockdraft.errors import ConfigError
from blockdraft.train.global_batch import Batch, given_on_command_line, resumed_grad_accum

CKPT = "runs/r/checkpoints/step_40"


@pytest.mark.parametrize("saved, micro, world, accum, line", [
    (Batch(4, 1, 2), 4, 1, 2, "[train] world size 2 -> 1: grad_accum 1 -> 2 keeps the global batch of 8 rows per step"),
    (Batch(1, 4, 1), 1, 4, 1, "[train] world size 1 -> 4: grad_accum 4 -> 1 keeps the global batch of 4 rows per step"),
    (Batch(1, 3, 4), 1, 6, 2, "[train] world size 4 -> 6: grad_accum 3 -> 2 keeps the global batch of 12 rows per step"),
    (Batch(4, 1, 2), 2, 2, 2, "[train] micro_batch_size 4 -> 2: grad_accum 1 -> 2 keeps the global batch of 8 rows per step"),
    (Batch(2, 1, 2), 1, 4, 1, "[train] world size 2 -> 4, micro_batch_size 2 -> 1: grad_accum 1 keeps the global batch of 4 rows per step"),
])
def test_another_world_size_or_micro_batch_size_keeps_the_global_batch(saved, micro, world, accum, line):
    # The recipe's grad_accum (1 here) is not given on the command line: the checkpoint's global batch wins.
    assert resumed_grad_accum(saved, micro, 1, world, given=False, checkpoint=CKPT) == (accum, line)
    assert Batch(micro, accum, world).rows == saved.rows


def test_the_same_split_says_nothing_and_a_recipe_grad_accum_follows_the_checkpoint():
    assert resumed_grad_accum(Batch(4, 2, 1), 4, 2, 1, given=False, checkpoint=CKPT) == (2, None)
    # A run continued on 1 rank earlier (grad_accum 2 there) keeps its global batch while the recipe still says 1.
    assert resumed_grad_accum(Batch(4, 2, 1), 4, 1, 1, given=False, checkpoint=CKPT) == (2, None)


@pytest.mark.parametrize("saved, micro, world, advice", [
    (Batch(1, 1, 2), 1, 3, "resume it on 1 or 2 ranks, or give train.grad_accum="),
    (Batch(4, 1, 2), 4, 4, "resume it on 1 or 2 ranks, or give train.grad_accum="),
    (Batch(2, 1, 2), 3, 1, "resume it with train.micro_batch_size=1, 2 or 4, or give train.grad_accum="),
    (Batch(2, 1, 2), 3, 3, "does not split evenly over them; give train.grad_accum="),
])
def test_a_world_size_that_cannot_split_it_is_refused_with_the_fix(saved, micro, world, advice):
    with pytest.raises(ConfigError) as err:
        resumed_grad_accum(saved, micro, 1, world, given=False, checkpoint=CKPT)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cannot resume from {CKPT} on {world} rank")
    assert f"its global batch of {saved.rows} rows per step" in message and advice in message


def test_a_grad_accum_given_on_the_command_line_is_used_as_given_and_said():
    accum, line = resumed_grad_accum(Batch(4, 1, 2), 4, 1, 1, given=True, checkpoint=CKPT)
    assert accum == 1 and line == ("[train] world size 2 -> 1 with train.grad_accum=1 as given: the global batch changes "
                                   "from 8 to 4 rows per step (leave train.grad_accum out to keep 8)")
    # Given, it may keep the global batch too (what the pipeline hands a continued run), or be refused by nothing.
    assert resumed_grad_accum(Batch(4, 1, 2), 4, 2, 1, given=True, checkpoint=CKPT)[0] == 2
    assert resumed_grad_accum(Batch(1, 1, 2), 1, 5, 3, given=True, checkpoint=CKPT)[0] == 5


def test_given_means_on_the_command_line():
    assert given_on_command_line(["experiment=tiny_cpu", "train.grad_accum=4"])
    assert given_on_command_line(["+train.grad_accum=4"]) and given_on_command_line(["++train.grad_accum=4"])
    assert not given_on_command_line(["experiment=tiny_cpu", "train.micro_batch_size=2", "grad_accum=4"])
