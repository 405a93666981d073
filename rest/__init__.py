"""HTTP plumbing both tiers' REST APIs share: problem details, bodies, tokens, OpenAPI, client."""
