"""vocab_seed.py MODEL DIR - fuzz_vocab's seeds from a checkpoint: its
vocabulary's JSON (selector byte 1) and texts in it (selector 0 and 4);
and for words (selector 2: a text for a fixed word vocabulary, 3: a word
vocabulary's JSON)."""
import json
import os
import struct
import sys

path, out = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    vocab = json.loads(json.loads(f.read(n))["__metadata__"]["vocab"])
name = os.path.basename(path).split(".")[0]
if isinstance(vocab, dict):   # SentencePiece: the model's bytes, and texts for it (selector 0xF0 and above)
    import base64
    model = base64.b64decode(vocab["sentencepiece"])
    text = "ROMEO: H\u00e9llo \U0001F642 there\n\nmy lord!\r\n\tWhat, ho?".encode()
    for k, b in {"spm-text": b"\xf0" + text, "spm-model": b"\xf1" + model}.items():
        with open(os.path.join(out, f"{name}-{k}"), "wb") as f:
            f.write(b)
    sys.exit(0)
text = "".join(vocab[i % len(vocab)] for i in range(0, 7 * len(vocab), 7)).encode()
seeds = {"json": b"\x01" + json.dumps(vocab).encode(), "text0": b"\x00" + text, "text2": b"\x04" + text + "é€😀".encode(),
         "words-text": b"\x02" + b"the cat  sat\r\n\ton a mat\r" + text,
         "words-json": b"\x03" + json.dumps(["<eos>", "<unk>", "the", "cat", "été", "a"]).encode()}
for k, b in seeds.items():
    with open(os.path.join(out, f"{name}-{k}"), "wb") as f:
        f.write(b)
