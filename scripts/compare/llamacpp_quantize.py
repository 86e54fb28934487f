"""Requantises a GGUF file to Q8_0 with llama.cpp's own quantiser (llama-cpp-python)."""
import ctypes
import sys

import llama_cpp

src, dst = sys.argv[1].encode(), sys.argv[2].encode()
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
params.allow_requantize = True
params.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(src, dst, ctypes.byref(params)))
