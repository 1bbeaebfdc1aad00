"""GPT-style language models: the named sizes (``sizes``, no torch) and the network (``model``)."""
