"""Requantises a GGUF file with llama.cpp's own quantiser (llama-cpp-python).

    llamacpp_quantize.py IN.gguf OUT.gguf [q8_0|q2_k|q3_k_m|q4_k_m|q5_k_m|q6_k|iq4_xs]     (default q8_0)"""
import ctypes
import sys

import llama_cpp

FTYPES = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
          "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M, "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
          "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M, "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
          "iq4_xs": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS}
src, dst = sys.argv[1].encode(), sys.argv[2].encode()
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = FTYPES[sys.argv[3] if len(sys.argv) > 3 else "q8_0"]
params.allow_requantize = True
params.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(src, dst, ctypes.byref(params)))
