"""Times llama.cpp (through llama-cpp-python) like colibri-bench: a 512-token prompt in
batches of 512, then 128 single-token decode steps; 2 threads; prints tok/s."""
import random, sys, time
from llama_cpp import Llama

path, reps = sys.argv[1], int(sys.argv[2])
llm = Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=1024, n_batch=512, n_ubatch=512, verbose=False)
rng = random.Random(1)
n_vocab = llm.n_vocab()
prompt = [rng.randrange(3, n_vocab) for _ in range(512)]
gen = [rng.randrange(3, n_vocab) for _ in range(128)]
for rep in range(reps):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for tok in gen:
        llm.eval([tok])
    t2 = time.perf_counter()
    print(f"llama.cpp prefill {512 / (t1 - t0):.1f} tok/s decode {128 / (t2 - t1):.1f} tok/s", flush=True)
