"""The held-out documents of your text (data/eval_split.py, as data/make_dataset.py applies it): chosen by a hash
of each document's text, so edits to the folder move no other document between train and eval."""

import math
import subprocess
import sys

from data.eval_split import Draws, EvalSplit, draw, split_text
from data.make_dataset import count_documents, documents
from data.text_files import expand_inputs
from tests.common import ROOT


def texts(count, start=0):
    return [f"document {i}\nits body, line one\nline two of {i}\n" for i in range(start, start + count)]


def held_out(docs, fraction=0.05):
    """{text: whether it is held out whole} of ``docs`` split together, and the split."""
    draws = Draws(fraction)
    for text in docs:
        draws.add(text)
    split = draws.split()[0]
    return {text: split.parts(text) == ("", text) for text in docs}, split


def folder_eval(folder, fraction=0.05):
    """The eval texts of a folder of .txt files, read as make_dataset reads them."""
    files = expand_inputs([str(folder)])
    draws = Draws(fraction)
    count_documents(files, False, print, draws)
    return sorted(documents(files, "eval", draws.split()[0]))


def test_the_draw_is_fixed_across_processes_and_machines():
    # SHA-256, not hash(): a golden value, and the same numbers from another process with another hash seed
    assert draw("hello") == 4132029244407842746
    assert draw("hello\r\n") == draw("  hello\n") == draw("hello")  # line endings, surrounding whitespace
    docs = texts(50)
    script = ("import sys; sys.path.insert(0, sys.argv[1]); from data.eval_split import draw; "
              "from tests.test_eval_split import texts; print([draw(t) for t in texts(50)])")
    out = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"}).stdout
    assert out.strip() == str([draw(t) for t in docs])
    assert held_out(docs)[0] == held_out(list(reversed(docs)))[0]  # the order of the input does not matter


def test_adding_or_removing_documents_moves_no_other_document():
    docs = texts(400)
    before, _ = held_out(docs)
    assert 0 < sum(before.values()) < 400
    for more in (texts(1, 400), texts(37, 1000)):
        after, split = held_out(docs + more)
        assert split == EvalSplit(0.05)  # no guard acted: each side is the document's own
        assert {t: after[t] for t in docs} == before
    fewer, _ = held_out(docs[::2])
    assert fewer == {t: before[t] for t in docs[::2]}


def test_renaming_and_adding_files_keeps_the_eval_documents(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, text in enumerate(texts(60)):
        (folder / f"{i:03d}.txt").write_text(text)
    held = folder_eval(folder)
    assert held  # 60 documents at 5%: some drawn below the fraction
    (folder / "000.txt").rename(folder / "zzz.txt")
    for i, text in enumerate(texts(5, 500)):  # sorted first: by position, every later document would shift
        (folder / f"-new{i}.txt").write_text(text)
    new_held = folder_eval(folder)
    assert set(held) <= set(new_held) and set(new_held) - set(held) <= set(texts(5, 500))


def test_the_fraction_is_kept_on_average():
    docs = [f"note {i}" for i in range(1000)]
    for fraction in (0.05, 0.1, 0.5):
        sides, _ = held_out(docs, fraction)
        spread = 3 * math.sqrt(1000 * fraction * (1 - fraction))  # binomial: three standard deviations
        assert abs(sum(sides.values()) - 1000 * fraction) < spread
    at_5, at_10 = held_out(docs, 0.05)[0], held_out(docs, 0.1)[0]
    assert {t for t in docs if at_5[t]} < {t for t in docs if at_10[t]}  # a larger fraction only adds


def test_tiny_folders():
    # One document: its last fraction, cut at a line break, is eval.
    book = "".join(f"line {i}\n" for i in range(100))
    _, split = held_out([book])
    assert not split.whole_documents and split.parts(book) == split_text(book, 0.05)
    assert split.parts(book)[1] == "".join(f"line {i}\n" for i in range(95, 100))
    assert held_out([book, book])[1] == split  # copies of one text: still one document
    # Two or three: one whole document is held out (none falls below 5%), the one of lowest hash.
    for n in (2, 3):
        docs = texts(n)
        sides, split = held_out(docs)
        assert sum(sides.values()) == 1 and split.to_eval == min(draw(t) for t in docs)
        assert sides[min(docs, key=draw)]
    # Every document below the fraction: the one of highest hash trains.
    sides, split = held_out(texts(3), 0.99)
    assert sum(sides.values()) == 2 and not sides[max(texts(3), key=draw)]


def test_a_small_folder_growing_never_moves_a_trained_document_to_eval():
    docs = texts(4)
    for i in range(4, 40):
        before, _ = held_out(docs)
        docs = docs + texts(1, i)
        after, _ = held_out(docs)
        assert not any(after[t] and not before[t] for t in before)  # the guarded one may go to train, no other
    assert sum(after.values()) >= 1


def test_description_says_how():
    draws = Draws(0.05)
    for text in texts(1000):
        draws.add(text)
    held = draws.split()[1]
    assert draws.described() == f"{held:,} of the documents, chosen by a hash of each one's text (5% on average)"
    small = Draws(0.05)
    for text in texts(3):
        small.add(text)
    assert small.described() == "1 of the documents, the one of lowest text hash (none fell below 5%)"
    one = Draws(0.05)
    one.add("a book")
    assert one.described() == "the last 5% of each document (a single distinct document)"
