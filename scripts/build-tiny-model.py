"""Builds the small random-weight Llama the end-to-end test serves with vLLM (no hub download).

Run with the vLLM environment's python (it needs torch, transformers, tokenizers):

    python scripts/build-tiny-model.py OUT_DIR

The vocabulary is made-up words ``w0`` ... ``w1023`` plus ``<unk>``, ``<s>``, ``</s>``, split on
white space (WordLevel), so a prompt of N words is exactly N tokens. Weights are bf16 from a fixed
seed: the same files every time. The folder is written beside OUT_DIR and renamed into place
when complete, so an interrupted build leaves nothing that looks finished.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SEED = 20261201
WORDS = 1024
# hidden 512 / 8 layers: prefill and decode cost real compute on a CPU, so batching pays and the
# pool, not the per-step overhead, caps throughput.
SHAPE = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
         "num_attention_heads": 8, "num_key_value_heads": 8}
MAX_POSITIONS = 2048


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{k}" for k in range(WORDS)])}
    core = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    )
    tokenizer.save_pretrained(tmp)

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(vocab), max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
        torch_dtype="bfloat16", **SHAPE,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / "kvpressure-model.json").write_text(
        json.dumps({"seed": SEED, "words": WORDS, **SHAPE}, indent=2, sort_keys=True) + "\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build-tiny-model.py OUT_DIR", file=sys.stderr)
        return 2
    build(Path(argv[1]))
    print(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
