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

from dataclasses import dataclass
from typing import Sequence

from perception.errors import ConfigError


@dataclass(frozen=True)
class Arm:
    name: str
    attention_pool: str  # model.attention_pool: "shared" | "per_horizon"
    context_to_heads: bool  # Path-A heads read the pooled context (model.shared_context_to_heads for shared)
    twin: bool = False  # model.twin: the A/A twin's own seed for the pool query and heads
    reseed: bool = False  # trains with seed + RESEED_OFFSET: another init and batch order throughout

    def model_fields(self) -> dict[str, object]:
        """The model config fields this arm sets."""
        return {
            "attention_pool": self.attention_pool,
            "shared_context_to_heads": self.context_to_heads and self.attention_pool == "shared",
            "twin": self.twin,
        }


BASE_ARMS = {
    a.name: a
    for a in (
        Arm("shared", "shared", context_to_heads=False),
        Arm("per_horizon", "per_horizon", context_to_heads=True),
        Arm("shared_skip", "shared", context_to_heads=True),
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
    arm = BASE_ARMS[base]
    return Arm(
        name, arm.attention_pool, arm.context_to_heads, twin=suffix == TWIN_SUFFIX, reseed=suffix == RESEED_SUFFIX
    )


def arm_of_model(attention_pool: str, shared_context_to_heads: bool = False, twin: bool = False) -> str:
    """The arm a model configuration is (runs set up with `model.*` alone, or made before arms)."""
    for arm in BASE_ARMS.values():
        if arm.attention_pool == attention_pool and (
            attention_pool != "shared" or arm.context_to_heads == bool(shared_context_to_heads)
        ):
            return arm.name + (TWIN_SUFFIX if twin else "")
    raise ConfigError(
        f"model.attention_pool={attention_pool!r}: expected one of "
        f"{sorted({a.attention_pool for a in BASE_ARMS.values()})}"
    )


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
