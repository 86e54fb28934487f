#pragma once
// The one table of tensor names in .colibri files. Converters write them, the loader
// reads them; no other file spells a tensor name.

#include <string>
#include <string_view>

namespace colibri::names {

inline constexpr std::string_view token_embd = "token_embd.weight";      // [n_vocab, n_embd]
inline constexpr std::string_view output_norm = "output_norm.weight";    // [n_embd]
inline constexpr std::string_view output_norm_bias = "output_norm.bias"; // [n_embd], LayerNorm
inline constexpr std::string_view output = "output.weight";              // [n_vocab, n_embd]
/// [head_dim / 2], optional: pair i's RoPE frequency is divided by it (scaled RoPE:
/// linear, llama3, YaRN; llama.cpp's rope_freqs)
inline constexpr std::string_view rope_freqs = "rope_freqs.weight";

/// Per-layer tensors: "blk.<il>.<suffix>".
namespace blk {
inline constexpr std::string_view attn_norm = "attn_norm.weight";     // [n_embd]
inline constexpr std::string_view attn_norm_bias = "attn_norm.bias";  // [n_embd], LayerNorm
inline constexpr std::string_view attn_q = "attn_q.weight";           // [n_head*head_dim, n_embd]
inline constexpr std::string_view attn_k = "attn_k.weight";           // [n_head_kv*head_dim, n_embd]
inline constexpr std::string_view attn_v = "attn_v.weight";           // [n_head_kv*head_dim, n_embd]
inline constexpr std::string_view attn_output = "attn_output.weight"; // [n_embd, n_head*head_dim (v_head_dim)]
inline constexpr std::string_view attn_q_bias = "attn_q.bias";
inline constexpr std::string_view attn_k_bias = "attn_k.bias";
inline constexpr std::string_view attn_v_bias = "attn_v.bias";
inline constexpr std::string_view attn_output_bias = "attn_output.bias"; // [n_embd]
inline constexpr std::string_view attn_q_norm = "attn_q_norm.weight";    // [head_dim] or [n_head*head_dim]
inline constexpr std::string_view attn_k_norm = "attn_k_norm.weight";
// latent attention (nope = head_dim - rope_dim; in = q_lora_rank, or n_embd without it)
inline constexpr std::string_view attn_q_a = "attn_q_a.weight";           // [q_lora_rank, n_embd]
inline constexpr std::string_view attn_q_a_norm = "attn_q_a_norm.weight"; // [q_lora_rank]
inline constexpr std::string_view attn_q_nope = "attn_q_nope.weight";     // [n_head*nope, in]
inline constexpr std::string_view attn_q_pe = "attn_q_pe.weight"; // [n_head*rope_dim, in], pairs (i, i + rope_dim/2)
inline constexpr std::string_view attn_kv_a = "attn_kv_a.weight"; // [kv_lora_rank, n_embd]
inline constexpr std::string_view attn_kv_a_norm = "attn_kv_a_norm.weight"; // [kv_lora_rank]
inline constexpr std::string_view attn_k_pe = "attn_k_pe.weight";           // [rope_dim, n_embd], pairs as attn_q_pe
inline constexpr std::string_view attn_k_b = "attn_k_b.weight";             // [n_head*kv_lora_rank, nope], f32/f16
inline constexpr std::string_view attn_v_b = "attn_v_b.weight";    // [n_head*v_head_dim, kv_lora_rank], f32/f16
inline constexpr std::string_view ffn_norm = "ffn_norm.weight";    // [n_embd]
inline constexpr std::string_view ffn_norm_bias = "ffn_norm.bias"; // [n_embd], LayerNorm
inline constexpr std::string_view attn_post_norm = "post_attention_norm.weight"; // [n_embd], sandwich norms
inline constexpr std::string_view ffn_post_norm = "post_ffw_norm.weight";        // [n_embd], sandwich norms
inline constexpr std::string_view ffn_gate_inp = "ffn_gate_inp.weight";          // router [n_expert, n_embd]
inline constexpr std::string_view ffn_gate = "ffn_gate.weight";                  // dense [n_ff, n_embd]
inline constexpr std::string_view ffn_up = "ffn_up.weight";                      // dense [n_ff, n_embd]
inline constexpr std::string_view ffn_down = "ffn_down.weight";                  // dense [n_embd, n_ff]
inline constexpr std::string_view ffn_up_bias = "ffn_up.bias";                   // dense [n_ff]
inline constexpr std::string_view ffn_down_bias = "ffn_down.bias";               // dense [n_embd]
inline constexpr std::string_view ffn_gate_shexp = "ffn_gate_shexp.weight";      // [n_ff_shexp, n_embd]
inline constexpr std::string_view ffn_up_shexp = "ffn_up_shexp.weight";
inline constexpr std::string_view ffn_down_shexp = "ffn_down_shexp.weight";         // [n_embd, n_ff_shexp]
inline constexpr std::string_view ffn_gate_inp_shexp = "ffn_gate_inp_shexp.weight"; // [1, n_embd]
} // namespace blk

/// Per-expert tensors: "blk.<il>.<kind>_exps.<e>.weight"; one expert's three are adjacent.
namespace exp {
inline constexpr std::string_view gate = "ffn_gate"; // [n_ff_exp, n_embd]
inline constexpr std::string_view up = "ffn_up";     // [n_ff_exp, n_embd]
inline constexpr std::string_view down = "ffn_down"; // [n_embd, n_ff_exp]
} // namespace exp

inline std::string layer(int il, std::string_view suffix) {
    return "blk." + std::to_string(il) + "." + std::string(suffix);
}

inline std::string expert(int il, int e, std::string_view kind) {
    return "blk." + std::to_string(il) + "." + std::string(kind) + "_exps." + std::to_string(e) + ".weight";
}

} // namespace colibri::names
