"""Times llama.cpp (through llama-cpp-python) like colibri-bench: a prompt of random tokens
(default 512) in batches of 512, then single-token decode steps (default 128); 2 threads;
prints tok/s per repetition, and the load-to-ready time and the process's peak RSS.

    llamacpp_bench.py MODEL.gguf REPS [PROMPT_TOKENS GEN_TOKENS]"""
import random, resource, sys, time

t_start = time.perf_counter()
from llama_cpp import Llama

path, reps = sys.argv[1], int(sys.argv[2])
n_prompt, n_gen = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (512, 128)
llm = Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=1024, n_batch=512, n_ubatch=512, verbose=False)
t_ready = time.perf_counter()
rng = random.Random(1)
n_vocab = llm.n_vocab()
prompt = [rng.randrange(3, n_vocab) for _ in range(n_prompt)]
gen = [rng.randrange(3, n_vocab) for _ in range(n_gen)]
for rep in range(reps):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for tok in gen:
        llm.eval([tok])
    t2 = time.perf_counter()
    print(f"llama.cpp prefill {n_prompt / (t1 - t0):.1f} tok/s decode {n_gen / (t2 - t1):.1f} tok/s", flush=True)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"llama.cpp load to ready {t_ready - t_start:.2f} s (process start, Python's import included), peak RSS {peak:.0f} MiB")
