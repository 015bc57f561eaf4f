from perftracker_ml.collectors.iteration import ExplicitSteps, IterationDetector, Token

F, P = Token.FETCH, Token.OPT  # fetch, optimizer step


def feed(det, tokens, t0=0, step_ns=10):
    out = []
    t = t0
    for tok in tokens:
        out.extend(det.feed(tok, t, t + 1))
        t += step_ns
    return out, t


def test_plain_loop_locks_after_repeats_and_emits_learned_iterations():
    det = IterationDetector(repeats=10)
    its, _ = feed(det, [F, P] * 9)
    assert its == [] and not det.locked
    its, _ = feed(det, [F, P], t0=180)
    assert det.pattern == (F, P)
    assert [i.step for i in its] == list(range(10))
    assert all(i.dur_ns == 11 for i in its)  # first fetch start .. optimizer step end


def test_locked_loop_numbers_iterations_and_tracks_current_step():
    det = IterationDetector(repeats=3)
    feed(det, [F, P] * 3)
    det.feed(F, 100, 101)
    assert det.step == 3
    its = det.feed(P, 110, 115)
    assert its[0].step == 3 and its[0].start_ns == 100 and its[0].dur_ns == 15


def test_gradient_accumulation_pattern():
    det = IterationDetector(repeats=4)
    its, _ = feed(det, [F, F, P] * 6)
    assert det.pattern == (F, F, P)
    assert [i.step for i in its] == list(range(6))


def test_warmup_noise_before_loop_is_ignored():
    det = IterationDetector(repeats=4)
    its, _ = feed(det, [F, F, F, P, P] + [F, P] * 4)
    assert det.pattern == (F, P) and len(its) == 4


def test_relearns_after_the_loop_changes():
    det = IterationDetector(repeats=4, relearn_after=8)
    feed(det, [F, P] * 6)
    assert det.pattern == (F, P)
    its, _ = feed(det, [F, F, P] * 12, t0=1000)
    assert det.pattern == (F, F, P)
    assert det.relearned == 1
    steps = [i.step for i in its]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


def test_sporadic_miss_does_not_unlock():
    det = IterationDetector(repeats=3, relearn_after=3)
    feed(det, [F, P] * 3)
    for _ in range(10):
        feed(det, [F, P] * 5 + [F])  # an extra fetch now and then (e.g. eval peek)
    assert det.pattern == (F, P) and det.relearned == 0


def test_explicit_steps():
    steps = ExplicitSteps()
    assert steps.mark(100) is None and steps.step == 0
    it = steps.mark(250)
    assert it.step == 0 and it.start_ns == 100 and it.dur_ns == 150 and steps.step == 1


def test_loop_without_a_dataloader_locks_on_optimizer_steps_alone():
    det = IterationDetector(repeats=4)
    its, _ = feed(det, [P] * 4)  # repeats tokens: one short of repeats + 1
    assert its == [] and not det.locked
    its, t = feed(det, [P], t0=40)
    assert det.pattern == (P,)
    # an iteration runs from one optimizer step's end to the next one's: 10 ns apart here
    assert [(i.step, i.start_ns, i.dur_ns) for i in its] == [(0, 1, 10), (1, 11, 10), (2, 21, 10), (3, 31, 10)]
    more = det.feed(P, 60, 63)
    assert more == (more[0],) and more[0].step == 4 and more[0].start_ns == 41 and more[0].dur_ns == 22


def test_a_fetch_before_the_first_step_keeps_the_fetch_pattern():
    det = IterationDetector(repeats=3)
    its, _ = feed(det, [F] + [P] * 6)  # a fetch seen: not a loop without a data loader
    assert its == [] and not det.locked
    its, _ = feed(det, [F, P] * 3, t0=100)
    assert det.pattern == (F, P)


def test_optimizer_only_pattern_relearns_when_a_dataloader_appears():
    det = IterationDetector(repeats=3, relearn_after=4)
    feed(det, [P] * 4)
    assert det.pattern == (P,)
    feed(det, [F, P] * 8, t0=100)
    assert det.pattern == (F, P)
