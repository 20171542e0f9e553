#!/usr/bin/env python3
"""Per-token routing of gpt-oss-20b from the public GPT-OSS-MoE-ExpertFingerprinting
data (github.com/AmanPriyanshu/GPT-OSS-MoE-ExpertFingerprinting @72b368f,
Apache-2.0; its data/ folder copied OUTSIDE this repository, path below) as
JSON [tokens][24 layers][4 ids], prompts concatenated in a round-robin over the
datasets: `all` (110 prompts, 38,154 generated tokens), `tune` and `holdout`
(10 prompts each, disjoint datasets). Usage: python3 gptoss_traces.py [DATA_DIR]
then bmoe trace import gptoss-all.json --slot-bytes 13271040 --experts 32 -o gptoss-all.bmrt."""
import sys
import json, glob, os, sys
root = sys.argv[1] if len(sys.argv) > 1 else '/work/big/traces/gptoss-fingerprinting/data'
def trace_of(files):
    out = []
    for f in files:
        d = json.load(open(f))
        for step in d['router_data']:
            (tok,) = step.values()
            out.append([tok[f'layer_{l}']['selected_experts'] for l in range(24)])
    return out
def files_of(prefixes, n):
    per = [sorted(f for f in glob.glob(root + '/**/*_examples.json', recursive=True)
                  if os.path.relpath(f, root).startswith(p)) for p in prefixes]
    out = []
    i = 0
    while len(out) < n and any(i < len(p) for p in per):
        for p in per:
            if i < len(p) and len(out) < n:
                out.append(p[i])
        i += 1
    return out
sets = {'all': (['mmlu_test', 'gpqa_main', 'tulu3', 'mmlu_validation', 'Polyglot', 'sorry', 'mmlu_pro_test', 'gpqa_diamond', 'gpqa_extended', 'mmlu_dev', 'mmlu_pro_validation'], 110),
        'tune': (['mmlu_test', 'gpqa_main', 'tulu3', 'mmlu_validation'], 10),
        'holdout': (['Polyglot', 'sorry', 'mmlu_pro_test', 'gpqa_diamond'], 10)}
for name, (pre, n) in sets.items():
    fs = files_of(pre, n)
    t = trace_of(fs)
    json.dump(t, open(f'gptoss-{name}.json', 'w'))
    print(name, len(fs), 'files', len(t), 'tokens', sorted({os.path.relpath(f, root).split('/')[0] for f in fs}))
