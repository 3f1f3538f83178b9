#!/usr/bin/env python3
"""The terminal-only paths of the CLI, driven through a real pseudo-terminal (pexpect): what a
user at a terminal sees, asserted on the bytes the terminal receives (stdout and stderr share it).

- colours and the load progress bar appear on a terminal, never when piped or with NO_COLOR;
- `kvboost chat` interactively: banner, `> ` prompt, streamed replies, the per-turn line,
  multi-line input (`\\` continuation and \"\"\" blocks), /reset, /system, /help, unknown
  commands, Ctrl-C stopping a reply (the program stays), Ctrl-C at the prompt (exit 130).

    python tests/cli/tty_test.py            # ctest: cli.tty; exit 77 (skip) without pexpect

Environment: KVBOOST_CLI (the binary), KVBOOST_MODELS_DIR (default <repo>/models).
"""
import os
import re
import subprocess
import sys

try:
    import pexpect
    import pytest
except ImportError as e:  # pragma: no cover - the ctest skip path
    if __name__ == "__main__":
        if os.environ.get("KVBOOST_REQUIRE_ORACLES") == "1":
            sys.exit(f"missing: {e}")
        print(f"SKIP: {e} (scripts/install-deps.sh pins pexpect)", file=sys.stderr)
        sys.exit(77)
    raise

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
KVBOOST = os.environ.get("KVBOOST_CLI", os.path.join(REPO, "build", "kvboost"))
STORIES = os.path.join(os.environ.get("KVBOOST_MODELS_DIR", os.path.join(REPO, "models")), "stories260K")
ESC = "\x1b["
TURN = re.compile(r"\[turn (\d+): prompt (\d+) tokens, (\d+) cached \((\d+)%\) \| ttft [\d.]+ ms \| (\d+) tokens, "
                  r"[\d.]+ tokens/s \| ([^\]]+)\]")


def env(**extra):
    e = dict(os.environ)
    for k in ("NO_COLOR", "KVBOOST_ISA"):
        e.pop(k, None)
    e["TERM"] = "xterm-256color"
    e.update(extra)
    return e


def spawn(args, **extra):
    return pexpect.spawn(KVBOOST, args, env=env(**extra), encoding="utf-8", codec_errors="replace",
                         timeout=90, dimensions=(50, 250))


def run_tty(args, **extra):
    """Everything the terminal shows for a command run to its end, and its exit status."""
    c = spawn(args, **extra)
    c.expect(pexpect.EOF)
    c.close()
    return c.before, c.exitstatus


GEN = ["generate", "-m", STORIES, "-p", "Once upon a time", "-n", "8", "--temp", "0"]


# --- colours and progress ------------------------------------------------------------------------

def test_generate_on_a_terminal_is_coloured_and_shows_the_load_bar():
    out, rc = run_tty(GEN)
    assert rc == 0, out
    assert "Once upon a time" in out
    # the statistics line is dim (SGR 2) and reset after
    assert re.search(r"\x1b\[2m[^\x1b]*time to first token", out), repr(out)
    assert "\x1b[0m" in out
    # the load progress bar: carriage-return redraws ending at 100%
    assert re.search(r"\r\x1b\[36m(?:packing|loading) .*stories260K \[#{25}\] 100%", out), repr(out[:400])


def test_no_color_on_a_terminal_means_no_escape_sequences():
    out, rc = run_tty(GEN, NO_COLOR="1")
    assert rc == 0, out
    assert "time to first token" in out
    assert ESC not in out, repr(out)


def test_term_dumb_means_no_escape_sequences():
    out, rc = run_tty(GEN, TERM="dumb")
    assert rc == 0, out
    assert "time to first token" in out and ESC not in out, repr(out)


def test_piped_output_has_no_colours_and_no_progress_bar():
    r = subprocess.run([KVBOOST, *GEN], capture_output=True, text=True, env=env(), timeout=90)
    assert r.returncode == 0, r.stderr
    assert "time to first token" in r.stderr
    assert ESC not in r.stdout and ESC not in r.stderr, repr(r.stderr)
    assert "\r" not in r.stderr and "100%" not in r.stderr


def test_error_is_red_on_a_terminal_only():
    out, rc = run_tty(["generate", "-m", "/nonexistent/model", "-p", "x"])
    assert rc != 0
    assert "/nonexistent/model" in out
    r = subprocess.run([KVBOOST, "generate", "-m", "/nonexistent/model", "-p", "x"], capture_output=True,
                       text=True, env=env(), timeout=30)
    assert r.returncode != 0 and "/nonexistent/model" in r.stderr and ESC not in r.stderr


# --- kvboost chat at a terminal ------------------------------------------------------------------

PROMPT = "\x1b[32m> \x1b[0m"


def chat(*more, **extra):
    c = spawn(["chat", "-m", STORIES, "--chat-template", "chatml", "--temp", "0", *more], **extra)
    c.expect_exact("kvboost chat: ")
    c.expect_exact("Ctrl-C stops a reply.")
    c.expect_exact(PROMPT)
    return c


def turn(c, message):
    """Send one message; return the per-turn numbers (turn, prompt, cached, pct, generated, finish)
    and the reply text as the terminal showed it."""
    c.sendline(message)
    c.expect(TURN)
    m = c.match
    shown = c.before
    c.expect_exact(PROMPT)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
            m.group(6)), shown


def test_chat_turns_reuse_the_conversation_and_reset_forgets_it():
    c = chat("-n", "12")
    (t1, p1, c1, _, g1, _), shown = turn(c, "Tell me a story.")
    assert t1 == 1 and p1 > 5 and g1 > 0
    assert "\x1b[36m" in shown  # the reply streams in cyan
    (t2, p2, c2, pct2, _, _), _ = turn(c, "And then?")
    assert t2 == 2 and p2 > p1 + g1 - 1, (p1, g1, p2)
    # turn 2 computes only what is new: the whole first turn came from the prefix cache
    assert c2 >= p1 and pct2 >= 50, (c2, p1, pct2)
    c.sendline("/reset")
    c.expect_exact("conversation reset")
    c.expect_exact(PROMPT)
    (t3, p3, _, _, _, _), _ = turn(c, "Tell me a story.")
    assert t3 == 3 and p3 == p1  # the conversation was forgotten: the same prompt as turn 1
    c.sendline("/exit")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0


def test_chat_multi_line_input_is_one_message():
    c = chat("-n", "4")
    (_, p_one, _, _, _, _), _ = turn(c, "Lily had a red ball.")
    c.sendline("/reset")
    c.expect_exact(PROMPT)
    # a trailing backslash continues the message; the terminal shows the continuation prompt
    c.sendline("Lily had a red ball.\\")
    c.expect_exact("... ")
    (t, p_two, _, _, _, _), _ = turn(c, "She liked to play.")
    assert t == 2 and p_two > p_one  # one turn, holding both lines
    c.sendline("/reset")
    c.expect_exact(PROMPT)
    # a """ block, the same two lines: the same message, so the same prompt size
    c.sendline('"""')
    c.expect_exact("... ")
    c.sendline("Lily had a red ball.")
    c.expect_exact("... ")
    c.sendline("She liked to play.")
    c.expect_exact("... ")
    (t, p_block, c_block, _, _, _), _ = turn(c, '"""')
    assert t == 3 and p_block == p_two
    assert c_block >= p_two - 1  # exactly that prompt was computed before (turn 2)
    c.sendline("/exit")
    c.expect(pexpect.EOF)


def test_chat_system_help_and_unknown_commands():
    c = chat("-n", "4")
    (_, p_plain, _, _, _, _), _ = turn(c, "Hello.")
    c.sendline("/system You are a storyteller who speaks in short sentences.")
    c.expect_exact("system message set; conversation reset")
    c.expect_exact(PROMPT)
    (t, p_sys, _, _, _, _), _ = turn(c, "Hello.")
    assert t == 2 and p_sys > p_plain + 8  # the system message is in the prompt now
    c.sendline("/system")
    c.expect_exact("system message cleared; conversation reset")
    c.expect_exact(PROMPT)
    (_, p_cleared, _, _, _, _), _ = turn(c, "Hello.")
    assert p_cleared == p_plain
    c.sendline("/help")
    c.expect_exact("/reset: forget the conversation")
    c.expect_exact(PROMPT)
    c.sendline("/frobnicate")
    c.expect_exact("unknown command /frobnicate")
    c.expect_exact(PROMPT)
    c.sendeof()  # Ctrl-D at the prompt leaves
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0


def slow_model():
    """A random-weight fixture whose greedy reply runs the whole budget without an end-of-text
    (seeded, so always the same) at tens to hundreds of tokens/s: a reply is still streaming
    when Ctrl-C arrives, however fast the machine. stories260K ends its stories in ~50 ms."""
    work = os.environ.get("KVBOOST_TTY_WORKDIR") or os.path.join(REPO, "build", "tests", "cli", "tty_work")
    out = os.path.join(work, "slow")
    if not os.path.isfile(os.path.join(out, "model.safetensors")):
        tool = os.environ.get("KVBOOST_FIXTURE_TOOL", os.path.join(os.path.dirname(KVBOOST), "kvboost-fixture"))
        subprocess.run([tool, "--out", out, "--preset", "tiny", "--hidden", "256", "--intermediate", "704",
                        "--layers", "4", "--heads", "4", "--kv-heads", "2", "--max-pos", "8192"],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def test_chat_ctrl_c_stops_a_reply_and_at_the_prompt_exits():
    c = spawn(["chat", "-m", slow_model(), "--chat-template", "chatml", "--temp", "0", "-n", "8000"])
    c.expect_exact("Ctrl-C stops a reply.")
    c.expect_exact(PROMPT)
    c.sendline("Tell me a very long story.")
    c.expect_exact("\x1b[36m")  # the reply has started streaming
    c.expect(r"\S{12}")  # some of it is on the screen
    c.sendintr()
    c.expect(TURN)
    assert c.match.group(6) == "stopped by Ctrl-C", c.match.group(0)
    p1, generated = int(c.match.group(2)), int(c.match.group(5))
    assert 0 < generated < 8000
    c.expect_exact(PROMPT)
    # the program is still there, and the partial reply is part of the conversation: the next
    # turn's prompt holds turn 1 and its reply (compared with the same message after /reset)
    def interrupted_turn(message):
        c.sendline(message)
        c.expect_exact("\x1b[36m")
        c.expect(r"\S{12}")
        c.sendintr()
        c.expect(TURN)
        assert c.match.group(6) == "stopped by Ctrl-C", c.match.group(0)
        n, prompt = int(c.match.group(1)), int(c.match.group(2))
        c.expect_exact(PROMPT)
        return n, prompt

    message = "/and then? (a message with a space is sent, not taken as a command)"
    t2, p2 = interrupted_turn(message)
    c.sendline("/reset")
    c.expect_exact("conversation reset")
    c.expect_exact(PROMPT)
    t3, p3 = interrupted_turn(message)
    assert (t2, t3) == (2, 3)
    assert p2 - p3 > p1 + generated // 2, (p1, generated, p2, p3)
    c.sendintr()  # at the prompt: exits
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 130, (c.exitstatus, c.signalstatus)


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", HERE, os.path.abspath(__file__), *sys.argv[1:]]))
