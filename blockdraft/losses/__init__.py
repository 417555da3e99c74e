"""The loss maths of a block drafter, as pure functions: the block CE and KL, the position weights and the
normalisation (block.py), DSpark's confidence target and BCE (confidence.py). Training's step and each kind's
own loss hook (blockdraft/kinds/<kind>/loss.py) compute with them; the kinds sit below training, so this room
sits below both."""
