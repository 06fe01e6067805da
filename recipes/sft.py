"""Runtime of the `sft` stage, started by recipes.launch under torchrun after the preflight: builds the
Megatron-Bridge 0.6.x ConfigContainer from the Ultra recipe and our config, then trains (see training/)."""

from .training.runtime import main

if __name__ == "__main__":
    main("sft")
