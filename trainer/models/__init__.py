"""What trains: the ResNets and the tiny CNN (resnet), the GPT decoders (gpt) and their named
sizes and FLOPs per token (gpt_sizes, torch-free: infra reads it), built by name (build)."""
