"""Scale past one machine: the learner on torch.distributed FSDP2, sharded checkpoints, the run entry
(`torchrun -m minite.distributed.torchrun_entry`), the meta-device memory plan of the paper model and the GPU
slots of local multi-GPU workflow runs. See docs/cluster.md.

Nothing here is imported by the single-process code paths; `import minite.distributed` stays cheap
(the submodules import torch.distributed on use).
"""
