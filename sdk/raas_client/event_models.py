"""A job's server-sent events and the callback secret, typed once: the gateway builds these,
the SDK parses them (`RaasClient.events`, `RaasClient.callback_secret`).

`GET /v1/jobs/{id}/events` sends, in completion order, a `rollout` event per finished rollout
(`RolloutEvent`), a `group` event after the rollout closing a group (`GroupView`), `alert`
events (`AlertView`) and a last `job` event (`JobView`); each event's id is the seq of the
last rollout sent, the point to resume after.
"""

from __future__ import annotations

from pydantic import Field

from raas_client.health_models import AlertView
from raas_client.models import Answer, GroupView, JobView


class RolloutEvent(Answer):
    """The data of a `rollout` event: a finished rollout in brief (`GET /v1/rollouts/{id}` has all of it)."""

    seq: int = Field(description="Place in the job's completion order (the event's id)")
    rollout_id: str = Field(description="The rollout")
    instance_id: str = Field(description="Its instance (its group)")
    sample_index: int = Field(description="Its sample of the instance")
    status: str = Field(description="Its terminal status")
    outcome: str | None = Field(None, description="How its episode ended (raas_client.models)")
    reward: float | None = Field(None, description="null unless graded")
    cut_reason: str | None = Field(None, description="Cut from its group by a straggler cut")
    group_complete: bool = Field(False, description="Closes its instance's group (a `group` event follows)")


EventData = RolloutEvent | GroupView | AlertView | JobView
EVENT_DATA: dict[str, type[Answer]] = {
    "rollout": RolloutEvent,
    "group": GroupView,
    "alert": AlertView,
    "job": JobView,
}


class JobEvent(Answer):
    """One event of a job's stream."""

    event: str = Field(description="rollout | group | alert | job")
    id: int = Field(description="Seq of the last rollout sent: pass it as `after` to resume")
    data: EventData | None = Field(
        None, description="The event's model by `event`; None for a kind this SDK does not know"
    )

    @classmethod
    def parse(cls, event: str, ident: int, data: object) -> JobEvent:
        """The event from its SSE fields (`data` the decoded JSON), typed by its kind."""
        model = EVENT_DATA.get(event)
        return cls(event=event, id=ident, data=model.model_validate(data) if model is not None else None)


class CallbackSecret(Answer):
    """GET /v1/callbacks/secret: what the owner's job callbacks are signed with."""

    owner: str = Field(description="The owner whose callbacks it signs")
    secret: str = Field(description="HMAC-SHA256 key (`raas_client.sdk.verify_callback`)")
    header: str = Field("X-Raas-Signature", description="The header carrying the signature")
    scheme: str = Field(description="How the signature is made")
