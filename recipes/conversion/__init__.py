"""The parts of `ultra3 convert` (recipes/convert.py) that need no Megatron-Bridge: the input checks and the parity
gate."""
