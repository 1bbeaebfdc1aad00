"""The Azure environment for distributed training, as Pulumi ComponentResources."""
