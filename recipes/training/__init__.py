"""The training runtime shared by recipes.pretrain and recipes.sft (inside the training container).

* plan       pure Python: our resolved job config -> what Megatron-Bridge is given (the recipe function,
             the model source, the dataset wiring, the override dotlist for its own override helper)
* hf_config  pure Python: the HF config.json of a model given by our keys (the tiny Ultra, no hub access)
* runtime    the Megatron-Bridge part: build the ConfigContainer from the 0.6.x Ultra recipe, apply the
             plan and the precision, train
"""
