"""Host cost per op on this machine: chains of small CUDA ops (host-bound), no grad and fwd+bwd."""
import time, torch, json, sys
dev = torch.device("cuda")
x = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
w = torch.randn(64, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
def timed(fn, n=5):
    fn(); torch.cuda.synchronize(); best = 1e9
    for _ in range(n):
        t = time.perf_counter(); fn(); torch.cuda.synchronize(); best = min(best, time.perf_counter() - t)
    return best
def chain_nograd():
    y = x
    with torch.no_grad():
        for _ in range(1000): y = y + 1.0
def chain_linear_fwd_bwd():
    y = x
    for _ in range(200): y = torch.nn.functional.gelu(y @ w)
    y.float().sum().backward()
out = {"add_nograd_s_per_op": timed(chain_nograd) / 1000,
       "linear_gelu_fwd_bwd_s_per_layer": timed(chain_linear_fwd_bwd) / 200}
print(json.dumps(out)); json.dump(out, open(sys.argv[1], "w"))
