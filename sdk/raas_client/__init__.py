"""Trainer-side SDK for raas (httpx + pydantic only: installs without the server)."""
from raas_client.sdk import RaasClient, RaasHTTPError

__all__ = ["RaasClient", "RaasHTTPError"]
