"""The study's arms (DESIGN §3 "Arms"): named model configurations, one registry for the trainer,
the sweep, the gate and the workflow. The MLflow tag `variant` and the run directory carry the name.

    shared       one shared query; the pooled context reaches the logits only through the CfC's h_0
    per_horizon  one query per horizon; each head also reads its own query's context (Path A)
    shared_skip  one shared query whose context also feeds Path-A heads: the fair control, which
                 separates "a query per horizon" from "pooled context reaches the heads"
    <arm>_twin   the A/A twin of an arm: the same configuration, trunk init and batch order, but
                 another seed for the pool query and the heads (the modules in which real arms differ)
    <arm>_reseed the fully reseeded A/A twin: the same configuration trained from another seed
                 altogether (every module's init and the batch order), the noisier null
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Mapping, Optional, Sequence

from perception.enums import as_enum, enum_value
from perception.errors import ConfigError


class AttentionPoolVariant(str, Enum):  # model.attention_pool, what arms differ in
    shared = "shared"  # one query (Q = 1): SharedQuery
    per_horizon = "per_horizon"  # one query per horizon (Q = H): PerHorizon


# The model fields an arm sets (`model.<field>`): `arm=NAME` is how a run chooses them. Given on their own
# they name an arm, so `model.attention_pool=per_horizon` is another spelling of `arm=per_horizon`.
ARM_FIELDS = ("attention_pool", "shared_context_to_heads", "twin")


@dataclass(frozen=True)
class Arm:
    name: str
    attention_pool: AttentionPoolVariant
    shared_context_to_heads: bool = False  # a shared pool's one context feeds Path-A heads too
    twin: bool = False  # the A/A twin's own seed for the pool query and heads
    reseed: bool = False  # trains with seed + RESEED_OFFSET: another init and batch order throughout

    def model_fields(self) -> dict[str, object]:
        """The model config fields this arm sets, by name (ARM_FIELDS)."""
        return {key: getattr(self, key) for key in ARM_FIELDS}


BASE_ARMS = {
    a.name: a
    for a in (
        Arm("shared", AttentionPoolVariant.shared),
        Arm("per_horizon", AttentionPoolVariant.per_horizon),
        Arm("shared_skip", AttentionPoolVariant.shared, shared_context_to_heads=True),
    )
}
TWIN_SUFFIX = "_twin"
RESEED_SUFFIX = "_reseed"
RESEED_OFFSET = 7_919_000  # far from seed + replicate of any real sweep, so a reseeded run shares no seed


@dataclass(frozen=True)
class Attribution:
    """The study's three arms: does the treatment's lift over the control come from a query per horizon,
    or only from pooled context reaching the heads, which the context-path control has as well?"""

    control: str
    context_control: str
    treatment: str

    @property
    def arms(self) -> tuple[str, str, str]:
        return (self.control, self.treatment, self.context_control)

    def read_beside(self, treatment: str) -> list[str]:
        """The arms a gate of `treatment` also reads where the sweep trained them."""
        return [self.context_control, self.control] if treatment == self.treatment else []

    def comparisons(self, control: str, treatment: str, present: Sequence[str]) -> dict[str, tuple[str, str]]:
        """What is compared beside control -> treatment, as (control, treatment) by name: the attribution
        (context-path control -> treatment) where the sweep has the context-path control, and with it the
        context path's own effect (control -> context-path control) where it has the control too."""
        if treatment != self.treatment or control == self.context_control or self.context_control not in present:
            return {}
        out = {"attribution": (self.context_control, treatment)}
        if self.control in present:
            out["context_path"] = (self.control, self.context_control)
        return out


ATTRIBUTION = Attribution(control="shared", context_control="shared_skip", treatment="per_horizon")
DEFAULT_ARMS = (ATTRIBUTION.control, ATTRIBUTION.treatment)  # the seed study's A/B: six trainings over three folds
DEFAULT_CONTROL, DEFAULT_TREATMENT = DEFAULT_ARMS


def arm_names() -> list[str]:
    return [*BASE_ARMS, *(name + suffix for suffix in (TWIN_SUFFIX, RESEED_SUFFIX) for name in BASE_ARMS)]


def get_arm(name: str) -> Arm:
    """The arm called `name`; a ConfigError listing every arm otherwise."""
    suffix = next((s for s in (TWIN_SUFFIX, RESEED_SUFFIX) if name.endswith(s)), "")
    base = name[: len(name) - len(suffix)]
    if base not in BASE_ARMS:
        raise ConfigError(f"arm {name!r} is not an arm of the study: expected one of {arm_names()}")
    return replace(BASE_ARMS[base], name=name, twin=suffix == TWIN_SUFFIX, reseed=suffix == RESEED_SUFFIX)


def arms_with_pool(pool: AttentionPoolVariant) -> list[str]:
    """The base arms of this attention pool (a checkpoint's variant)."""
    return [a.name for a in BASE_ARMS.values() if a.attention_pool is pool]


def choose_arm(name: Optional[str], model: Mapping[str, object]) -> Arm:
    """A run's arm: `arm=NAME`; without it, the arm the model's ARM_FIELDS name (None: as the control
    has it), so that `model.attention_pool=per_horizon` alone still chooses per_horizon. A model field
    that disagrees with `arm=NAME` is a ConfigError naming both, never silently overridden."""
    given = {key: value for key, value in model.items() if key in ARM_FIELDS and value is not None}
    if "attention_pool" in given:
        given["attention_pool"] = as_enum(AttentionPoolVariant, given["attention_pool"], "model.attention_pool")
    if name is None:
        return _named_by(given, BASE_ARMS[DEFAULT_CONTROL])
    arm = get_arm(name)
    for key, value in given.items():
        wanted = arm.model_fields()[key]
        if enum_value(value) != enum_value(wanted):
            raise ConfigError(
                f"arm={name} and model.{key}={_spelled(value)} disagree: arm {name} has "
                f"model.{key}={_spelled(wanted)}. arm=NAME chooses the model; drop model.{key}"
                + _or_the_arm_with(given, arm)
            )
    return arm


def _named_by(given: Mapping[str, object], like: Arm) -> Arm:
    """The arm (a base arm or a twin) with these model fields, unset ones as `like` has them."""
    fields = {**like.model_fields(), **given}
    for name in arm_names():
        arm = get_arm(name)
        if not arm.reseed and arm.model_fields() == fields:
            return arm
    raise ConfigError(
        f"{_fields(given)}: no arm of the study has these model fields; choose an arm=NAME of {arm_names()}"
    )


def _or_the_arm_with(given: Mapping[str, object], like: Arm) -> str:
    try:
        return f", or choose arm={_named_by(given, like).name}, which has {_fields(given)}"
    except ConfigError:
        return ""


def _fields(given: Mapping[str, object]) -> str:
    return " ".join(f"model.{key}={_spelled(value)}" for key, value in given.items())


def _spelled(value: object) -> str:
    """A value as a command line spells it: per_horizon, true."""
    return str(value).lower() if isinstance(value, bool) else str(enum_value(value))


def parse_arms(text: str, where: str = "--arms") -> tuple[str, ...]:
    """'a,b[,c]' -> checked arm names, at least two and none repeated."""
    names = tuple(n.strip() for n in str(text).split(",") if n.strip())
    for name in names:
        try:
            get_arm(name)
        except ConfigError as exc:
            raise ConfigError(f"{where} {text!r}: {exc}") from None
    if len(names) < 2 or len(set(names)) != len(names):
        raise ConfigError(f"{where} {text!r}: expected at least two different arms, e.g. shared,per_horizon")
    return names
