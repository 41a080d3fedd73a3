"""PyTorch on a GPU, the anchor for tandem's own figures on the same card (run by
scripts/gpu-run-packed): the card's copy bandwidth, then a Llama of the default model's shape
(SmolLM2-135M-Instruct; random weights, since speed does not depend on them) in f16 through
transformers: the forward of k new tokens over a 64-token cache, and greedy `generate`."""

import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

dev = "cuda"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


src = torch.randn(1 << 29, device=dev, dtype=torch.float16)  # 1 GiB
dst = torch.empty_like(src)
for _ in range(3):
    dst.copy_(src)
ms = timed(lambda: dst.copy_(src), 10)
bandwidth = 2 * src.numel() * 2 / (ms / 1e3)
print(f"copy bandwidth: {bandwidth / 1e9:.0f} GB/s (bytes read + written)")
del src, dst

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
)
model = LlamaForCausalLM(config).to(dev, torch.float16).eval()
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
print(f"weights: {weight_bytes / 1e6:.1f} MB in f16; bound at that bandwidth: "
      f"{weight_bytes / bandwidth * 1e3:.3f} ms")

with torch.no_grad():
    prompt = torch.randint(0, 49152, (1, 64), device=dev)
    cache = DynamicCache()
    model(prompt, past_key_values=cache, use_cache=True)
    one = None
    for k in (1, 2, 4, 8, 16, 32):
        ids = torch.randint(0, 49152, (1, k), device=dev)

        def step():
            model(ids, past_key_values=cache, use_cache=True)
            cache.crop(64)

        for _ in range(5):
            step()
        ms = timed(step, 30)
        one = one or ms
        print(f"forward of {k:2d} tokens over 64: {ms:.3f} ms ({ms / one:.2f}x)")

    for _ in range(2):
        model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=128, min_new_tokens=128, do_sample=False)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t
    new = out.shape[1] - prompt.shape[1]
    print(f"generate: {new} tokens in {secs:.3f} s, {new / secs:.1f} tok/s "
          f"({secs / new * 1e3:.2f} ms a token)")
