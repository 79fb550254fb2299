"""URL slugs from arbitrary titles."""
from slugify.slug import slugify, unique_slug

__all__ = ["slugify", "unique_slug"]
