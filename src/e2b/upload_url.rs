//! Signed upload URLs: the PUT of a COPY archive carries no API key, so its URL authorizes it.
