"""A text of 102 SmolLM2 tokens of prose that starts with the token 'Z' (the benchmarks wait for it in the pattern)."""

LM_EDIT = ("Zebras live on the grasslands of eastern and southern Africa, where they graze in large herds. Each zebra "
           "has its own pattern of black and white stripes, and no two are alike. Scientists still argue about why the "
           "stripes evolved: they may confuse predators, keep biting flies away, or help the animals stay cool in the "
           "midday sun.\nZebras live on the grasslands of eastern and southern Africa, where they graze in large herds. "
           "Each zebra has its own pattern of black and white stripes.")  # 102 SmolLM2 tokens; 'Z' is the first
