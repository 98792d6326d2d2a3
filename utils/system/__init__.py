"""The machine and the processes. Imports nothing here: signals load before torch.

signals      stop requests, exit code 3, the command that continues a stopped run
cpu_math     the same bits from MKL's matrix products on every run (set before torch runs)
claim        one run per folder at a time: a lock the kernel ends with the process
device       trainer.device, fast defaults, CPU threads per process
distributed  torchrun's processes, DDP, collectives
seeding      seeds, per-rank streams, RNG states in checkpoints
memory       cycle collection by the loop; the out-of-memory message; what fits in memory
compilation  torch.compile, or eager with one warning
sharding     trainer.strategy: how the model is split across processes (FSDP2)
"""
