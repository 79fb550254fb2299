"""Trainer-side SDK for raas (httpx only)."""
from client.sdk import RaasClient, RaasHTTPError

__all__ = ["RaasClient", "RaasHTTPError"]
