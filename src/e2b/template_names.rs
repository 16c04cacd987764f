//! e2b template names: `[namespace/]alias[:tag]`, tags and build resources.
