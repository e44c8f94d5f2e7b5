"""The fast path under every SUT: each model's runner, and the steps it picks from (the CPU's fused C step, CUDA
graphs), their kernels and weight layouts."""
