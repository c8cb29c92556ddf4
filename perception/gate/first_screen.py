"""The first screen of report.md (DESIGN §7): a few plain sentences that answer "what now?" — the
decision, the lift where it was decided with its interval in AUC points, how strong the evidence is,
what the lift can be attributed to and the one next step — then what to look at before acting on it.

One writer per kind of decision (`WRITERS`, keyed by `decision_kind`); a new kind of decision adds its
own writer there. Every writer reads the same `Facts`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from perception.arms import ATTRIBUTION
from perception.gate.decision import GateResult, RuleResult
from perception.gate.evidence import t_quantile
from perception.gate.inputs import SweepInputs
from perception.gate.study import Study

# What each rule means, in the words the report uses for it
RULE_MEANING = {"rule 1": "lift at the deployment horizons", "rule 2": "shift toward short horizons"}
# A fold and horizon whose AUC is this many null standard errors under 0.5 (on windows thinned to
# independent ones) is clearly below it; one under FAR_BELOW is named even when chance could explain it
CLEARLY_BELOW_Z = 2.0
FAR_BELOW = 0.40


@dataclass
class Screen:
    sentences: list[str]
    look_at: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [*self.sentences, ""]
        if self.look_at:
            out += ["**Look at before acting:**", ""] + [f"- {x}" for x in self.look_at] + [""]
        return out


@dataclass
class Facts:
    """What every first-screen writer reads, computed once."""

    sweep_id: str
    study: Study
    inputs: SweepInputs
    cfg: dict  # report.json's "config"
    experiment: Optional[str]  # the runs' `experiment` param
    summary: dict = field(default_factory=dict)  # report.json: a sequential study's looks among it

    @property
    def main(self) -> GateResult:
        return self.study.main

    def rule(self, name: str) -> RuleResult:
        return next(r for r in self.main.rules if r.name == name)

    def fired_rule(self) -> RuleResult:
        """The rule that decided; a decision to ship, and an inconclusive one, always name it."""
        assert self.main.rule is not None
        return self.rule(self.main.rule)


def decision_kind(decision: Optional[str]) -> str:
    """refused | ship | keep | inconclusive (or any other decision word as it is)."""
    if decision is None:
        return "refused"
    return decision.split("_", 1)[0] if decision.startswith(("ship_", "keep_")) else decision


def first_screen(summary: dict, study: Optional[Study] = None, inputs: Optional[SweepInputs] = None) -> list[str]:
    """The report's opening lines (markdown), for any decision or a refusal."""
    if summary["refused"]:
        return _refused(summary).lines()
    assert study is not None and inputs is not None
    facts = Facts(summary["sweep_id"], study, inputs, summary["config"], inputs.params.get("experiment"), summary)
    screen = WRITERS[decision_kind(summary["decision"])](facts)
    screen.look_at = look_at(facts) + screen.look_at
    return screen.lines()


# ---------------------------------------------------------------- words shared by the writers


def points(x: float, sign: bool = True) -> str:
    """An AUC difference in AUC points (0.01 AUC = 1 point)."""
    return "–" if not math.isfinite(x) else f"{100 * x:{'+' if sign else ''}.1f}"


def horizons_text(hs: list[int]) -> str:
    names = [f"h{h}" for h in hs]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def interval(rule: RuleResult) -> tuple[float, float, float]:
    """(confidence, low, high): the two-sided interval whose lower end is the rule's lower bound."""
    if not (math.isfinite(rule.se) and math.isfinite(rule.level)):
        return math.nan, math.nan, math.nan
    t = t_quantile(rule.level, rule.df)
    return 1 - 2 * rule.level, rule.lift - t * rule.se, rule.lift + t * rule.se


def interval_text(rule: RuleResult) -> str:
    conf, lo, hi = interval(rule)
    if not math.isfinite(conf):
        return "no interval (no standard error)"
    return f"{100 * conf:.0f} % interval [{points(lo)}, {points(hi)}]"


def w_definition(f: Facts) -> str:
    weights = {h: f.cfg["weights"].get(f"h{h}", 0) for h in f.inputs.horizons}
    used = {h: w for h, w in weights.items() if w}
    how = (
        f"at {horizons_text(list(used))}"
        if len(used) == 1
        else "weighted " + ", ".join(f"h{h} {w:g}" for h, w in used.items())
    )
    return (
        f"W, the validation-AUC lift B − A ({f.main.treatment} − {f.main.control}) {how}, "
        f"averaged over {f.inputs.n_folds} folds"
        + (f" and {len(f.inputs.replicates)} replicates" if len(f.inputs.replicates) > 1 else "")
    )


def g_definition(f: Facts) -> str:
    return f"G, the mean lift at the shift horizons {horizons_text(f.cfg['shift_horizons'])}"


def lift_sentence(f: Facts, rule: RuleResult) -> str:
    if rule.name == "rule 1":
        return f"There {w_definition(f)}, is {points(rule.lift)} AUC points, {interval_text(rule)}."
    w = f.rule("rule 1")
    return (
        f"There {g_definition(f)} (B − A, over folds), is {points(rule.lift)} AUC points, {interval_text(rule)}; "
        f"{w_definition(f)}, is {points(w.lift)}."
    )


def noise_words(rule: RuleResult, f: Facts) -> str:
    if rule.fold_spread:
        return (
            f"against the spread of the {f.inputs.n_folds} folds' lifts, which disagree more than their windows "
            f"and trainings explain (p = {rule.heterogeneity_p:.2g})"
        )
    return {
        "between folds": f"against the spread of the {f.inputs.n_folds} folds' lifts",
        "windows + replicates": f"against the noise of the windows and of {len(f.inputs.replicates)} replicates",
        "windows + A/A file": "against the noise of the windows and this experiment's A/A measurement",
    }.get(rule.variance, "")


def test_words(rule: RuleResult, f: Facts) -> str:
    return (
        f"a one-sided t test of {rule.lift_name} {noise_words(rule, f)} gives p = {rule.p_bootstrap:.3g}, "
        f"{'under' if rule.evidence_test else 'above'} the {rule.level:g} this rule may use "
        f"(α = {f.cfg['alpha']:g} shared by the two rules, Holm's method)"
    )


def sweep_command(f: Facts, *flags: str, this_sweep: bool = True) -> str:
    """`perception-sweep local` continuing this sweep, or (`this_sweep=False`) starting a new one: replicates
    added to a sweep after its gate has looked would test it again on the same question (the sequential
    design is the way to do that)."""
    return " ".join(
        [
            "perception-sweep local",
            *([f"--sweep-id {f.sweep_id}"] if this_sweep else []),
            *flags,
            *([f"experiment={f.experiment}"] if f.experiment else []),
        ]
    )


def three_arm_command(f: Facts, replicates: Optional[int] = None, this_sweep: bool = True) -> str:
    r = replicates or len(f.inputs.replicates)
    return sweep_command(
        f, f"--arms {','.join(ATTRIBUTION.arms)}", *([f"--replicates {r}"] if r > 1 else []), this_sweep=this_sweep
    )


def _is_two_arm_study(f: Facts) -> bool:
    """The seed comparison without its third arm: its lift may be the queries' or the context path's."""
    return (
        f.study.attribution is None
        and f.main.control == ATTRIBUTION.control
        and f.main.treatment == ATTRIBUTION.treatment
    )


def attribution_sentence(f: Facts) -> Optional[str]:
    attr = f.study.attribution
    if attr is not None:
        return (
            f"Attribution, against `{attr.control}` (one shared query, the same heads): {f.study.verdict} "
            f"(`{attr.decision}`, W = {points(attr.W)} points)."
        )
    if _is_two_arm_study(f):
        return (
            f"What the lift is due to is open: `{f.main.control}` → `{f.main.treatment}` changes the queries "
            f"and also feeds pooled context to the heads, and only a third arm, `{ATTRIBUTION.context_control}`, "
            f"separates the two."
        )
    return None


# ---------------------------------------------------------------- one writer per kind of decision


def _ship(f: Facts) -> Screen:
    m = f.main
    rule = f.fired_rule()
    where = (
        f"at the deployment horizon{'s' if len(rule.horizons) > 1 else ''} {horizons_text(rule.horizons)}"
        if rule.name == "rule 1"
        else f"toward the short horizons {horizons_text(rule.horizons)}"
    )
    bar = (
        f"{rule.lift_name} ≥ {points(f.cfg['min_lift'], False)} AUC point"
        if rule.name == "rule 1"
        else "G > 0 and G ≥ −W"
    )
    s = [
        f"**Ship `{m.treatment}`**: it beats `{m.control}` {where} (the rule *{RULE_MEANING[rule.name]}*: {bar}).",
        lift_sentence(f, rule),
    ]
    if rule.evidence_test:
        s.append(f"The evidence is strong: {test_words(rule, f)}.")
    else:
        conf, lo, _ = interval(rule)
        s.append(
            f"The evidence is strong: the interval's lower end, {points(lo)} points, clears the noise floor of "
            f"{points(f.cfg['noise_floor'], False)} points."
        )
    overstated = math.isfinite(rule.mde) and rule.lift < rule.mde
    if overstated:
        s.append(
            f"But this sweep reliably detects only lifts of {points(rule.mde, False)} points or more (its minimum "
            f"detectable effect), so a lift seen at {points(rule.lift)} just cleared the bar and is likely "
            f"overstated: expect less on new data."
        )
    attribution = attribution_sentence(f)
    if attribution:
        s.append(attribution)
    s.append("Next: " + _ship_next(f, overstated))
    return Screen(s)


def _ship_next(f: Facts, overstated: bool) -> str:
    attr = f.study.attribution
    replicates = max(3, 2 * len(f.inputs.replicates))
    if _is_two_arm_study(f):
        return (
            f"add the third arm to this sweep, `{three_arm_command(f)}` (with the sweep's other overrides, if "
            f"any): {f.inputs.n_folds * len(f.inputs.replicates)} more trainings, then the gate again."
        )
    if attr is not None and attr.decision == f"keep_{attr.control}":
        return f"prefer `{attr.control}`: the lift comes from the context path, which it has with one shared query."
    if attr is not None and attr.decision != f"ship_{attr.treatment}":
        return (
            f"settle the attribution with more replicates, in a new sweep: "
            f"`{three_arm_command(f, replicates, this_sweep=False)}`."
        )
    if overstated:
        return (
            f"confirm the size with more replicates before relying on it: "
            f"a new sweep, `{sweep_command(f, f'--replicates {replicates}', this_sweep=False)}`."
        )
    return f"adopt `{f.main.treatment}`."


def _keep(f: Facts) -> Screen:
    m, w, g = f.main, f.rule("rule 1"), f.rule("rule 2")
    s = [
        f"**Keep `{m.control}`**: `{m.treatment}` gives neither a *{RULE_MEANING['rule 1']}* "
        f"{horizons_text(w.horizons)} (W ≥ {points(f.cfg['min_lift'], False)} AUC point) nor a "
        f"*{RULE_MEANING['rule 2']}* {horizons_text(g.horizons)} (G > 0 and G ≥ −W).",
        f"{w_definition(f)[0].upper()}{w_definition(f)[1:]}, is {points(w.lift)} AUC points, {interval_text(w)}; "
        f"{g_definition(f)}, is {points(g.lift)}.",
        f"A keep needs no evidence, but it rules out only large lifts: this sweep would have shipped a true W of "
        f"{points(w.mde, False)} points 8 times in 10 (its minimum detectable effect), not smaller ones.",
    ]
    attribution = f.study.attribution and attribution_sentence(f)
    if attribution:
        s.append(attribution)
    s.append(
        f"Next: nothing; keep `{m.control}`."
        + (
            f" Only to rule out lifts under {points(w.mde, False)} points: a new sweep, "
            f"`{sweep_command(f, '--replicates 3', this_sweep=False)}`."
            if len(f.inputs.replicates) == 1 and math.isfinite(w.mde) and w.mde > 2 * f.cfg["min_lift"]
            else ""
        )
    )
    return Screen(s)


def _inconclusive(f: Facts) -> Screen:
    m = f.main
    rule = f.fired_rule()
    conf, lo, _ = interval(rule)
    s = [
        f"**Inconclusive**: `{m.treatment}` is ahead of `{m.control}` by the rule *{RULE_MEANING[rule.name]}* "
        f"({horizons_text(rule.horizons)}), but the evidence is too weak to tell that lift from noise.",
        lift_sentence(f, rule),
        f"The evidence is weak: {test_words(rule, f)}, and the interval "
        + (
            "reaches below zero."
            if math.isfinite(lo) and lo < 0
            else f"stays under the noise floor of {points(f.cfg['noise_floor'], False)} points at its lower end."
        ),
    ]
    attribution = attribution_sentence(f)
    if attribution:
        s.append(attribution)
    if len(f.inputs.replicates) == 1 and f.study.noise is None:
        s.append(
            "Next: calibrate this experiment first, `perception-sweep calibrate --experiment "
            f"{f.experiment or 'NAME'}` "
            f"(A/A sweeps that measure its training noise), then gate again with `{sweep_command(f)}`."
        )
    else:
        replicates = max(3, 2 * len(f.inputs.replicates))
        s.append(
            f"Next: more replicates, in a new sweep: "
            f"`{sweep_command(f, f'--replicates {replicates}', this_sweep=False)}`."
        )
    return Screen(s)


def _refused(summary: dict) -> Screen:
    reasons = summary["reasons"]
    first = reasons[0].rstrip(".") if reasons else "no reason recorded"
    return Screen(
        [
            f"**Refused**: the gate could not compare this sweep's runs, so nothing was decided "
            f"({len(reasons)} problem{'s' if len(reasons) != 1 else ''}, listed below).",
            f"The first: {first}.",
            f"Next: fix that, then `perception-sweep local --sweep-id {summary['sweep_id']}` (with the sweep's "
            "overrides) "
            f"resumes what did not finish and gates again; a workflow's sweep: `perception-sweep submit --sweep-id "
            f"{summary['sweep_id']}`.",
        ]
    )


def _continue(f: Facts) -> Screen:
    """A look of a sequential study that crossed no boundary: the study trains another wave."""
    m, s_ = f.main, f.summary
    row: dict = next((r for r in s_.get("looks", []) if r.get("look") == s_.get("look")), {})
    lift = row.get("lift") or "W"
    rule = f.rule("rule 1" if lift == "W" else "rule 2")
    low, high = (row.get("repeated_ci") or [None, None])[:2]
    ci = (
        ""
        if low is None or high is None
        else f", repeated interval [{points(low)}, {points(high)}] (it holds at every look at once)"
    )
    definition = w_definition(f) if lift == "W" else g_definition(f)
    wave = s_.get("next_wave") or {}
    p_key = "p_W" if lift == "W" else "p_G"
    return Screen(
        [
            f"**Continue**: at look {s_.get('look')} of {s_.get('max_looks')} `{m.treatment}` against `{m.control}` "
            f"crossed no boundary, so nothing is decided yet.",
            f"So far {definition}, is {points(rule.lift)} AUC points{ci}.",
            "The evidence is not yet enough either way: "
            + (
                f"p = {row[p_key]:.3g} against this look's share of α, {row['efficacy_alpha']:.3g}."
                if row.get(p_key) is not None and row.get("efficacy_alpha") is not None
                else "no boundary was crossed."
            ),
            f"Next: the next wave, replicate {wave.get('replicate')} ({wave.get('trainings')} trainings), then the "
            "gate "
            f"looks again; `{sweep_command(f)}` continues an interrupted sweep.",
        ]
    )


WRITERS: dict[str, Callable[[Facts], Screen]] = {
    "ship": _ship,
    "keep": _keep,
    "inconclusive": _inconclusive,
    "continue": _continue,
}


# ---------------------------------------------------------------- what to look at before acting


def look_at(f: Facts) -> list[str]:
    out = []
    if f.study.exploratory:
        out.append(
            "**exploratory**: the gate's settings differ from the sweep's plan: " + "; ".join(f.study.exploratory)
        )
    out += losses(f.main)
    out += [f"{flag[0].upper()}{flag[1:]}." for flag in f.study.flags]
    out += below_half(f.main, f.inputs)
    return out


def losses(m: GateResult) -> list[str]:
    """Horizons the treatment loses at by more than one standard error of Δ_h."""
    lost = [(h, d, m.se_by_horizon.get(h, math.nan)) for h, d in m.delta.items()]
    lost = [(h, d, se) for h, d, se in lost if math.isfinite(se) and d < -se]
    if not lost:
        return []
    return [
        f"`{m.treatment}` loses at "
        + ", ".join(f"h{h} ({points(d)} points, se {points(se, False)})" for h, d, se in lost)
        + (": more than one standard error each." if len(lost) > 1 else ": more than one standard error.")
    ]


def below_half(m: GateResult, inputs: SweepInputs) -> list[str]:
    """Folds and horizons where an arm's validation AUC is under 0.5: a model that predicts the opposite."""
    thinned = {(r["fold"], r["horizon"]): r["delong_thinned"]["n"] for r in m.per_fold}
    rows = []
    for j, h in enumerate(inputs.horizons):
        folds = []
        for fold in range(inputs.n_folds):
            aucs = {v: float(m.auc[v]["per_fold"][fold, j]) for v in (m.control, m.treatment)}
            n = thinned.get((fold, h), 0)
            se0 = math.sqrt((n + 1) / (3 * n * n)) if n > 0 else math.nan  # Mann–Whitney under AUC = 0.5, balanced
            worst = min(aucs.values())
            clearly = math.isfinite(se0) and worst < 0.5 - CLEARLY_BELOW_Z * se0
            if clearly or worst < FAR_BELOW:
                folds.append((fold, aucs, n, se0, clearly))
        if folds:
            rows.append(_below_half_line(h, folds, inputs.n_folds))
    return rows


def _below_half_line(h: int, folds: list, n_folds: int) -> str:
    clear = [x for x in folds if x[-1]]
    if not clear:  # far under 0.5, yet within what chance gives on so few independent windows
        return (
            f"AUC under 0.5 at h{h}: "
            + "; ".join(
                f"fold {fold} "
                + ", ".join(f"{v} {a:.2f}" for v, a in aucs.items())
                + f" ({n} independent windows: se {se0:.2f} around 0.5, so chance can give this)"
                for fold, aucs, n, se0, _ in folds
            )
            + ". More validation data would tell a reversed relation from chance."
        )
    where = "; ".join(
        f"fold {fold} "
        + ", ".join(f"{v} {a:.2f}" for v, a in aucs.items())
        + f" ({n} independent windows, se {se0:.2f} around 0.5)"
        for fold, aucs, n, se0, _ in clear
    )
    every = len(clear) == n_folds
    return (
        f"AUC clearly below 0.5 at h{h}: {where}. A model under 0.5 predicts the opposite: either the relation "
        f"reversed between the training folds and this validation fold, or the labels are misaligned with the "
        f"windows. A reversal belongs to a fold; misaligned labels show in every fold at this horizon: here "
        + (
            "every fold, so check how the labels are built."
            if every
            else f"{len(clear)} of {n_folds} folds, which points to a reversal in "
            f"{'that fold' if len(clear) == 1 else 'those folds'}."
        )
        + " Either way, this horizon's lift there is not evidence of skill."
    )
