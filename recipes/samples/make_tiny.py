"""Generate the tiny sample corpora and tokenizer used by the `tiny` data-prep config and the tests.

    python -m recipes.samples.make_tiny [--out recipes/samples/tiny]

Everything is generated here, deterministically (seeded), from word lists and sentence patterns written
for this file, so the output is free of third-party text and the same on every machine:

* `corpus.jsonl.gz`: ~2,600 short English "stories" (`{"id", "text"}` per line, ~2 MB uncompressed);
* `encyclopedia.parquet`: ~700 encyclopedia-style entries (`{"id", "title", "content"}`, zstd), a second
  dataset in another format and with another text field, to exercise multi-dataset blends;
* `tokenizer.json`: a byte-level BPE tokenizer (4,096 tokens; `<|endoftext|>`, `<|pad|>` and the chat
  template's markers special)
  trained on both with Hugging Face `tokenizers`, and `tokenizer_config.json` naming its EOS token as a
  Hugging Face checkpoint does.

Re-running it reproduces the files byte for byte (gzip without a timestamp, a fixed Parquet writer).
The generator functions (`stories`, `entries`) are imported by the tests and the benchmark to make
larger corpora of the same kind.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
from collections.abc import Iterator

NOUNS = """river mountain village garden window harbor lantern forest meadow castle bridge market
kitchen library teacher farmer sailor merchant soldier painter doctor student king queen child mother
father brother sister friend stranger traveler shepherd miller baker captain letter journey storm winter
summer autumn spring morning evening night candle fire stone road field orchard cottage tower valley
island ocean ship wagon horse dog cat bird owl fox wolf deer apple bread cheese coat hat boot door
table chair clock bell song story book map key coin ring sword shield lamp mirror river well fountain
hill cliff cave desert snow rain wind cloud star moon sun shadow light voice silence promise secret
dream memory question answer lesson garden festival wedding harvest supper breakfast chapel school
mill forge stable barn fence gate path lane square street city town kingdom empire council court judge
lawyer priest monk poet singer dancer hunter fisherman weaver potter carpenter blacksmith widow orphan
neighbor guest servant master scholar physician engine machine telescope compass lighthouse railway
station carriage parcel newspaper telegram violin piano picture portrait statue museum theatre""".split()

ADJECTIVES = """old young quiet bright dark cold warm gentle brave clever foolish kind cruel proud humble
tall short small great little ancient silver golden green blue red white black grey heavy light strange
familiar lonely cheerful tired hungry honest patient careful curious distant narrow wide deep shallow
sudden slow swift soft loud wild calm busy empty crowded faithful famous forgotten hidden broken simple
rich poor plain noble common rare wise restless solemn merry weary eager silent frozen golden pale
crooked steady wooden iron velvet dusty fragrant bitter sweet sharp dull clear misty stormy sunny""".split()

VERBS = [  # (present, past)
    ("walk", "walked"), ("carry", "carried"), ("open", "opened"), ("close", "closed"), ("watch", "watched"),
    ("follow", "followed"), ("find", "found"), ("lose", "lost"), ("build", "built"), ("break", "broke"),
    ("see", "saw"), ("hear", "heard"), ("call", "called"), ("answer", "answered"), ("ask", "asked"),
    ("remember", "remembered"), ("forget", "forgot"), ("bring", "brought"), ("send", "sent"),
    ("keep", "kept"), ("leave", "left"), ("reach", "reached"), ("cross", "crossed"), ("climb", "climbed"),
    ("paint", "painted"), ("write", "wrote"), ("read", "read"), ("sing", "sang"), ("sell", "sold"),
    ("buy", "bought"), ("mend", "mended"), ("guard", "guarded"), ("visit", "visited"), ("greet", "greeted"),
    ("praise", "praised"), ("teach", "taught"), ("learn", "learned"), ("gather", "gathered"),
    ("hide", "hid"), ("seek", "sought"), ("lead", "led"), ("love", "loved"), ("fear", "feared"),
    ("cook", "cooked"), ("plant", "planted"), ("measure", "measured"), ("study", "studied"),
    ("describe", "described"), ("discover", "discovered"), ("explain", "explained"), ("repair", "repaired"),
]
INTRANSITIVE = [("wait", "waited"), ("sleep", "slept"), ("laugh", "laughed"), ("weep", "wept"),
                ("arrive", "arrived"), ("wander", "wandered"), ("rest", "rested"), ("listen", "listened"),
                ("travel", "traveled"), ("return", "returned"), ("smile", "smiled"), ("hesitate", "hesitated")]
ADVERBS = """slowly quickly quietly gladly sadly carefully suddenly often rarely always never gently
bravely softly proudly patiently eagerly silently warmly honestly early late again together alone""".split()
PREPOSITIONS = "across beside beyond under over near behind through toward along inside past".split()
NAMES = ["Anna", "Thomas", "Margaret", "Henry", "Clara", "Walter", "Eliza", "Samuel", "Agnes", "Oliver",
         "Ruth", "Edmund", "Beatrice", "Hugh", "Martha", "Felix", "Ada", "Jonas", "Lucy", "Tobias",
         "José", "Zoë", "Søren", "Chloé", "Mikhail", "Ingrid", "Björn", "Amélie", "Nadia", "Otto"]
PLACES = ["Ashford", "Bramble Hill", "Elmstead", "Fairhaven", "Greywater", "Hollowmere", "Kingsbridge",
          "Larkfield", "Millbrook", "Northwood", "Oakridge", "Pebblecombe", "Queensport", "Ravenholm",
          "Stonebury", "Thornbury", "Upperdale", "Westmarch", "Yarrow", "Zell am See", "São Bento", "Århus"]
TIMES = ["In the morning", "At dusk", "Before dawn", "Late that night", "On the following day",
         "In the spring of that year", "Long ago", "After the storm", "When the bells rang", "At noon"]
SYLLABLES = """al an ar ba bel bran cor dal del dun el en fal fen gar gil hal ham har hel in kel ker lan
lor mar mel mor nor or os pen quin ral ren rod sal sel ston tal tham thor ur vel wen wick win yor zan""".split()
FIELDS = ["astronomy", "botany", "geology", "navigation", "architecture", "music", "medicine", "weaving",
          "agriculture", "mathematics", "history", "chemistry", "cartography", "metallurgy", "poetry"]



# the markers of recipes/dataprep/templates/nemotron3.jinja, one token each as in the real tokenizer
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
               "<tool_response>", "</tool_response>"]

def surname(rng: random.Random) -> str:
    """A made-up family name of 2-3 syllables (thousands of them: enough for a 4k-token BPE to learn)."""
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).title()


def _np(rng: random.Random) -> str:
    """A noun phrase."""
    roll = rng.random()
    if roll < 0.08:
        return rng.choice(NAMES)
    if roll < 0.15:
        return f"{rng.choice(NAMES)} {surname(rng)}"
    art = rng.choice(["the", "the", "a", "an old", "every", "one", "that", "her", "his", "their"])
    adj = f"{rng.choice(ADJECTIVES)} " if rng.random() < 0.6 else ""
    noun = rng.choice(NOUNS)
    if art == "a" and (adj or noun)[0] in "aeiou":
        art = "an"
    return f"{art} {adj}{noun}"


def sentence(rng: random.Random) -> str:
    verb, past = rng.choice(VERBS)
    _, ipast = rng.choice(INTRANSITIVE)
    k = rng.randrange(10)
    if k == 0:
        s = f"{rng.choice(TIMES)}, {_np(rng)} {past} {_np(rng)} {rng.choice(PREPOSITIONS)} {_np(rng)}"
    elif k == 1:
        s = f"{_np(rng)} {ipast} {rng.choice(ADVERBS)}, and {_np(rng)} {past} {_np(rng)}"
    elif k == 2:
        name = rng.choice(NAMES)
        s = f"\u201c{rng.choice(['Why', 'How', 'When', 'Where'])} did you {verb} {_np(rng)}?\u201d asked {name}"
    elif k == 3:
        s = f"{_np(rng)} would {verb} {_np(rng)} if {_np(rng)} {ipast} {rng.choice(PREPOSITIONS)} {_np(rng)}"
    elif k == 4:
        s = (f"There were {rng.randint(2, 99)} {rng.choice(NOUNS)}s in {rng.choice(PLACES)} "
             f"in the year {rng.randint(1500, 1950)}")
    elif k == 5:
        s = f"{_np(rng)} was {rng.choice(ADJECTIVES)} \u2014 {rng.choice(ADVERBS)} {rng.choice(ADJECTIVES)}"
    elif k == 6:
        s = f"{_np(rng)} {ipast} {rng.choice(ADVERBS)} {rng.choice(PREPOSITIONS)} {_np(rng)}"
    elif k == 7:
        s = f"Nobody knew why {_np(rng)} had {past} {_np(rng)}"
    elif k == 8:
        s = f"{_np(rng)} {past} {_np(rng)}, but {_np(rng)} {ipast}"
    else:
        s = f"{_np(rng)} and {_np(rng)} {past} {_np(rng)} {rng.choice(ADVERBS)}"
    s = s[0].upper() + s[1:]
    return s if k == 2 else s + rng.choice([".", ".", ".", "!"])


def story(rng: random.Random) -> str:
    title = f"The {rng.choice(ADJECTIVES).title()} {rng.choice(NOUNS).title()} of {rng.choice(PLACES)}"
    paragraphs = [" ".join(sentence(rng) for _ in range(rng.randint(2, 9))) for _ in range(rng.randint(1, 4))]
    return title + "\n\n" + "\n\n".join(paragraphs)


def stories(seed: int = 1) -> Iterator[dict]:
    """An endless, seeded stream of `{"id", "text"}` story documents."""
    rng = random.Random(seed)
    i = 0
    while True:
        yield {"id": f"story-{seed}-{i:07d}", "text": story(rng)}
        i += 1


def entry(rng: random.Random) -> tuple[str, str]:
    subject = f"{rng.choice(ADJECTIVES).title()} {rng.choice(NOUNS).title()}"
    place = rng.choice(PLACES)
    born = rng.randint(1500, 1900)
    lines = [f"{subject} is a {rng.choice(['town', 'custom', 'craft', 'instrument', 'society', 'method'])} "
             f"associated with {place}, first described in {born} by {rng.choice(NAMES)} "
             f"{rng.choice(['of', 'from', 'near'])} {rng.choice(PLACES)}."]
    for _ in range(rng.randint(1, 5)):
        lines.append(f"In {rng.choice(FIELDS)}, it is known for {_np(rng)}; "
                     f"about {rng.randint(3, 97)}% of scholars {rng.choice(VERBS)[1]} {_np(rng)} "
                     f"between {born + rng.randint(1, 40)} and {born + rng.randint(41, 120)}. {sentence(rng)}")
    return subject, "\n".join(lines)


def entries(seed: int = 2) -> Iterator[dict]:
    """An endless, seeded stream of `{"id", "title", "content"}` encyclopedia entries."""
    rng = random.Random(seed)
    i = 0
    while True:
        title, content = entry(rng)
        yield {"id": f"entry-{seed}-{i:07d}", "title": title, "content": content}
        i += 1


def take(gen: Iterator[dict], n: int) -> list[dict]:
    return [next(gen) for _ in range(n)]


def write_jsonl_gz(path: str, docs: list[dict]) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
        for d in docs:
            f.write((json.dumps(d, ensure_ascii=False) + "\n").encode())


def write_parquet(path: str, docs: list[dict], row_group_size: int = 200) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({k: [d[k] for d in docs] for k in docs[0]})
    pq.write_table(table, path, row_group_size=row_group_size, compression="zstd", store_schema=False)


def train_tokenizer(texts: list[str], vocab_size: int = 4096):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|pad|>", *CHAT_TOKENS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny"))
    parser.add_argument("--stories", type=int, default=2600)
    parser.add_argument("--entries", type=int, default=700)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    docs = take(stories(), args.stories)
    ents = take(entries(), args.entries)
    write_jsonl_gz(os.path.join(args.out, "corpus.jsonl.gz"), docs)
    write_parquet(os.path.join(args.out, "encyclopedia.parquet"), ents)
    tok = train_tokenizer([d["text"] for d in docs] + [e["content"] for e in ents])
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "pad_token": "<|pad|>", "model_max_length": 4096}, f, indent=2)
        f.write("\n")
    for name in sorted(os.listdir(args.out)):
        print(f"{name}: {os.path.getsize(os.path.join(args.out, name)):,} bytes")


if __name__ == "__main__":
    main()
