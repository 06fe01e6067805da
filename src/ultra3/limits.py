"""How much a config may hold before it is refused, whichever reader meets it first (YAML, TOML,
interpolations): a few hundred hostile bytes can otherwise expand to billions of values."""

MAX_DEPTH = 32  # levels of tables and lists, keys included: a config has a few
MAX_REPEATS = 10_000  # values YAML aliases may repeat in one document: 200 bytes of them can repeat billions
MAX_DIGITS = 100  # an integer longer than this is no config's (the schema holds them to 64 bits)
TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep; a config is a few levels of tables"
TOO_LONG = f"an integer of more than {MAX_DIGITS} digits; a config's integers fit in 64 bits (19 digits)"
