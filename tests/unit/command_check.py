"""Commands as the docs and the messages write them: found, made concrete, and checked without the work.

A command is checked the way a user's first try would fail: the app exists, its keys compose and
validate (the app's own `--cfg job`, run in this process), a Makefile target exists, a script
exists. Placeholders become concrete values first: `<a|b>` the first choice, a target directory one
of the config-only targets below (the recipe's shape, so its layer ids validate), rows an earlier command
wrote the example chats, any other `<...>` a path under a scratch folder.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[2]
# Words a command line may start with that are not the command: an environment, an interpreter path.
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
APP_MODULES = {
    "blockdraft.pipeline": "pipeline", "blockdraft.regen": "regen",
    "blockdraft.capture": "capture", "blockdraft.train": "train", "blockdraft.export": "export",
    "blockdraft.serve": "serve", "blockdraft.eval": "eval", "blockdraft.gate": "gate",
    "blockdraft.models.suggest": "suggest", "blockdraft.demo": "demo",
}
TARGET_KEYS = ("target", "target_dir", "target.path")
ROWS_KEYS = ("rows", "heldout_rows")  # rows a page's earlier command wrote


@dataclass
class Command:
    where: str  # file:line
    text: str
    context: str = ""  # the whole line it stands in

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


# --- finding them ---------------------------------------------------------------------------
COMMAND_START = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\S*/)?(?:blockdraft\s|python3?\s+-m\s+blockdraft|torchrun\s|make\s|"
                           r"vllm\s+serve\s|(?:bash\s+)?scripts/[\w/.-]+\.(?:py|sh)\b)")


def commands_in_markdown(path: Path) -> List[Command]:
    """Lines of fenced code blocks (continuations joined, comments cut) and inline code spans that
    start with a command of this project."""
    found, in_block, pending, start = [], False, "", 0
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if in_block:
            text = (pending + " " + line.strip()).strip() if pending else line.strip()
            start = start if pending else number
            if text.endswith("\\"):
                pending = text[:-1]
                continue
            pending = ""
            text = re.sub(r"\s+#\s.*$", "", text).strip()
            if COMMAND_START.match(text):
                found.append(Command(f"{path.relative_to(REPO)}:{start}", text, text))
        else:
            for span in re.findall(r"`([^`]+)`", line):
                if COMMAND_START.match(span) and ("=" in span or " " not in span.strip() or span.split()[1:2]):
                    found.append(Command(f"{path.relative_to(REPO)}:{number}", span.strip(), line))
    return found


# --- making them concrete ------------------------------------------------------------------
def strip_optional_groups(text: str) -> str:
    """`[key=value ...]` spans of a synopsis are optional: dropped. A value `key=[a,b]` stays."""
    out, depth = [], 0
    for i, ch in enumerate(text):
        if ch == "[" and (depth or i == 0 or text[i - 1] == " "):
            depth += 1
            continue
        if ch == "]" and depth:
            depth -= 1
            continue
        if not depth:
            out.append(ch)
    return "".join(out)


def words_of(text: str) -> List[str]:
    text = re.sub(r"<[^<>]*>", lambda m: m.group(0).replace(" ", "_"), text)  # `<HF dir>` is one word
    text = strip_optional_groups(text)
    return [w for w in shlex.split(text) if w not in ("...", "…")]


class Concrete:
    """Values for placeholders and paths: targets of the right shape, scratch paths for the rest."""

    def __init__(self, scratch: Path, targets: dict):
        self.scratch, self.targets = scratch, targets  # targets: shape name -> directory

    def target_for(self, value: str, words: List[str]) -> str:
        from blockdraft.config.target_argument import target_groups

        if value in target_groups() and not Path(value).is_dir():
            return value  # a config group (tiny, smollm2_135m, ...), not a directory
        if Path(value).is_dir() and (Path(value) / "config.json").is_file():
            return value
        shape = " ".join([value, *words]).lower()
        for name, directory in self.targets.items():
            if name in shape:
                return str(directory)
        return str(self.targets["tiny"])

    def value(self, key: str, value: str, words: List[str]) -> str:
        choice = re.fullmatch(r"<([^<>|]+)\|[^<>]*>", value)
        if choice:
            value = choice.group(1)
        if key in TARGET_KEYS:
            return self.target_for(value, words)
        if key in ROWS_KEYS and not Path(value).exists():
            return self.earlier_rows(key)
        options = sorted(p.stem for p in (REPO / "configs" / key).glob("*.yaml"))
        if options and ("<" in value or value == "..."):  # a config group: the smallest recipe stands in
            return "tiny_cpu" if "tiny_cpu" in options else options[0]
        if re.fullmatch(r"<?[A-Z]>?", value):  # a count such as train.nproc=N
            return "2"
        if "<" in value or value == "...":
            return str(self.scratch / re.sub(r"[^A-Za-z0-9_.-]+", "_", key))
        return value

    def earlier_rows(self, key: str) -> str:
        """Rows an earlier command of the page wrote (`rows=runs/.../train.jsonl`): examples/chats.jsonl's rows
        stand in, the last four held out, so that the two keys never share a prompt."""
        rows = (REPO / "examples" / "chats.jsonl").read_text().splitlines()
        path = self.scratch / f"{key}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(rows[-4:] if key == "heldout_rows" else rows[:-4]) + "\n")
        return str(path)

    def words(self, words: List[str], app: str = "") -> List[str]:
        out = []
        for word in words:
            key, sep, value = word.partition("=")
            if not sep and word.startswith("<") and "target" not in word:
                continue  # `<training overrides>`: more words of the reader's, none needed
            out.append(f"{key}={self.value(key.lstrip('+~'), value, words)}" if sep else self.positional(word, words))
        return out + self.reader_choices(words, app)

    @staticmethod
    def reader_choices(words: List[str], app: str) -> List[str]:
        """`target=<dir>` stands for the reader's own target, whose mask token they pick (the apps that train
        refuse without one, naming suggest's candidate): the stand-in's own is added for them."""
        placeholder = any(w.split("=", 1)[0] in TARGET_KEYS and "<" in w for w in words)
        chosen = any(w.startswith(("experiment=", "draft.mask_token_id=")) for w in words)
        return ["draft.mask_token_id=262"] if placeholder and not chosen and app in ("pipeline", "train", "capture", "gate") else []

    def positional(self, word: str, words: List[str]) -> str:
        return self.target_for(word, words) if word.startswith("<") else word


# --- checking them -------------------------------------------------------------------------
def split_command(text: str):
    """(kind, app or target, arguments): kind is app, make, script or vllm; None when not one of ours."""
    words = words_of(text)
    while words and (ENV_WORD.match(words[0])):
        words = words[1:]
    if not words:
        return None
    head = Path(words[0]).name
    if head in ("python", "python3") and words[1:2] == ["-m"]:
        module = words[2]
        return ("app", APP_MODULES.get(module, module), words[3:])
    if head == "blockdraft":  # `blockdraft` or `blockdraft <command> ...`: the synopsis, checked as --help
        command = words[1] if len(words) > 1 and not words[1].startswith("<") else "--help"
        return ("app", command, words[2:] if command != "--help" else [])
    if head == "torchrun":
        at = words.index("-m")
        return ("app", APP_MODULES.get(words[at + 1], words[at + 1]), words[at + 2:])
    if head == "make":
        return ("make", None, words[1:])
    if head == "vllm":
        return ("vllm", None, words[2:])
    if head == "bash":
        words = words[1:]
    if words[0].startswith("scripts/"):
        return ("script", words[0], words[1:])
    return None


def run_app(app: str, args: List[str]) -> tuple:
    """The app's dry check in this process: (exit status, what it printed)."""
    from blockdraft import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), prompt_plan_read_once():
        try:
            status = cli.main([app, *args])
        except SystemExit as done:
            status = done.code if isinstance(done.code, int) else 1
    return status, out.getvalue()


# The pipeline's and the demo's preflight plans regen's prompt splits: it reads ShareGPT's 11k conversations and
# templates and tokenises thousands of them (about 5 s a check), the same ones in every check of this process.
# Both are read once here: the plan is still the app's own, computed from what it would have read.
_CONVERSATIONS: dict = {}  # (set, limit) -> conversations, for the packaged sets only (a file may change)
_PROMPT_IDS: dict = {}  # (tokenizer, template, its variables, the messages) -> token ids


@contextlib.contextmanager
def prompt_plan_read_once():
    from unittest import mock

    from blockdraft.regen import prompt_plan

    read, tokenise = prompt_plan.source_conversations, prompt_plan.prompt_ids

    def source_conversations(spec: str, limit: int):
        if spec not in ("sharegpt", "tiny_prompts"):
            return read(spec, limit)
        if (spec, limit) not in _CONVERSATIONS:
            _CONVERSATIONS[spec, limit] = read(spec, limit)
        return list(_CONVERSATIONS[spec, limit])

    def prompt_ids(tokenizer, messages, chat_template_kwargs=None):
        key = (tokenizer.name_or_path, len(tokenizer), tokenizer.chat_template, json.dumps(chat_template_kwargs, sort_keys=True),
               hashlib.sha256(json.dumps(messages).encode()).digest())
        if key not in _PROMPT_IDS:  # compact: some 20k prompts of a few hundred tokens each
            _PROMPT_IDS[key] = array.array("l", tokenise(tokenizer, messages, chat_template_kwargs))
        return list(_PROMPT_IDS[key])

    with mock.patch.object(prompt_plan, "source_conversations", source_conversations), \
            mock.patch.object(prompt_plan, "prompt_ids", prompt_ids):
        yield


def check(command: Command, concrete: Concrete) -> Optional[str]:
    """None when the command is well formed; else why not."""
    parts = split_command(command.text)
    if parts is None:
        return f"not a command this check knows: {command.text!r}"
    kind, name, args = parts
    if kind == "make":
        makefile = (REPO / "Makefile").read_text()
        missing = [t for t in args if not re.search(rf"^{re.escape(t)}:", makefile, re.M)]
        return f"no Makefile target {missing}" if missing else None
    if kind == "script":
        if "retired" in command.context:  # a figure's provenance: the script lives in the commit named there
            return None
        return None if (REPO / name).is_file() else f"{name} does not exist"
    if kind == "app" and name.startswith("blockdraft.") and name not in APP_MODULES.values():  # another module of ours
        import importlib.util

        return None if importlib.util.find_spec(name) else f"no module {name}"
    if kind == "vllm":
        return check_vllm_serve(args)
    if name in ("--help", "--version") or "--help" in args or "-h" in args or not args:
        # `blockdraft pipeline` in a sentence names the app; its synopsis is its help
        status, printed = run_app(name, ["--help"] if name not in ("--help", "--version") else [])
        return None if status == 0 else f"exit {status}: {printed[-400:]}"
    words = concrete.words(args, name)
    status, printed = run_app(name, [*words, "--cfg", "job"])
    return None if status == 0 else f"exit {status} for {name} {' '.join(words)} --cfg job:\n{printed[-600:]}"


def check_vllm_serve(args: List[str]) -> Optional[str]:
    """`vllm serve <target> --speculative-config '<json>'`: the JSON parses and names what vLLM reads."""
    if "--speculative-config" not in args:
        return None
    raw = args[args.index("--speculative-config") + 1]
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as err:
        return f"--speculative-config is not JSON: {err}"
    problems = [k for k in ("method", "model", "num_speculative_tokens") if k not in spec]
    if spec.get("method") not in ("dflash", "dspark", None):
        problems.append(f"method {spec.get('method')!r}")
    return f"--speculative-config lacks or misnames {problems}" if problems else None


def config_only_target(path: Path, family: str, tokenizer_from: Path, **shape) -> Path:
    """A target directory with a real family's config.json (and a small tokenizer): what composing and
    validating read; no weights, which `--cfg job` never loads."""
    import transformers as T

    config = {"qwen3": T.Qwen3Config, "llama": T.LlamaConfig}[family](**shape)
    config.architectures = [{"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[family]]
    path.mkdir(parents=True, exist_ok=True)
    config.to_json_file(path / "config.json")
    for name in tokenizer_from.iterdir():
        if "token" in name.name or name.name == "chat_template.jinja":
            (path / name.name).write_bytes(name.read_bytes())
    return path
