-- Users, tokens, billing projects and resource rates: projections of control events.
-- Times are BIGINT milliseconds since the epoch (events carry ms).

-- users: one row per user; written by the projector from user.created / user.deleted.
CREATE TABLE users (
  name VARCHAR(100) NOT NULL,
  login_id VARCHAR(255) NULL,
  is_developer BOOLEAN NOT NULL DEFAULT FALSE,
  is_service_account BOOLEAN NOT NULL DEFAULT FALSE,
  deleted BOOLEAN NOT NULL DEFAULT FALSE,
  time_created_ms BIGINT NOT NULL,
  time_deleted_ms BIGINT NULL,
  PRIMARY KEY (name),
  INDEX users_login_id (login_id)
) ENGINE=InnoDB;

-- auth_tokens: API tokens, stored only as the hex sha256 of the secret; written by the
-- projector from token.issued / token.revoked. Ingest authenticates by token_hash.
CREATE TABLE auth_tokens (
  token_id VARCHAR(64) NOT NULL,
  user VARCHAR(100) NOT NULL,
  token_hash CHAR(64) NOT NULL,
  time_created_ms BIGINT NOT NULL,
  expires_at_ms BIGINT NULL,
  revoked BOOLEAN NOT NULL DEFAULT FALSE,
  time_revoked_ms BIGINT NULL,
  PRIMARY KEY (token_id),
  UNIQUE INDEX auth_tokens_token_hash (token_hash),
  INDEX auth_tokens_user (user)
) ENGINE=InnoDB;

-- billing_projects: status and spending limit (NULL: none); written by the projector from
-- billing_project.* events.
CREATE TABLE billing_projects (
  name VARCHAR(100) NOT NULL,
  status ENUM('open', 'closed', 'deleted') NOT NULL DEFAULT 'open',
  limit_usd DECIMAL(18, 6) NULL,
  time_created_ms BIGINT NOT NULL,
  time_updated_ms BIGINT NOT NULL,
  PRIMARY KEY (name),
  INDEX billing_projects_status (status)
) ENGINE=InnoDB;

-- billing_project_users: members of a billing project; written by the projector from
-- billing_project.member_added / member_removed (removal deletes the row).
CREATE TABLE billing_project_users (
  billing_project VARCHAR(100) NOT NULL,
  user VARCHAR(100) NOT NULL,
  time_added_ms BIGINT NOT NULL,
  PRIMARY KEY (billing_project, user),
  INDEX billing_project_users_user (user, billing_project)
) ENGINE=InnoDB;

-- resources: billed resources 'product/version' (e.g. compute/n1-preemptible/1) and their rate
-- in USD per unit of usage (usage units per hail-api.md: mCPU*ms, MiB*ms, 1/1024 worker*ms).
-- A rate never changes for a version: a new rate is a new version. Written by the projector
-- from resource.rate_set.
CREATE TABLE resources (
  resource VARCHAR(100) NOT NULL,
  product VARCHAR(100) NOT NULL,
  version VARCHAR(40) NOT NULL,
  rate DECIMAL(30, 18) NOT NULL,
  time_created_ms BIGINT NOT NULL,
  PRIMARY KEY (resource),
  UNIQUE INDEX resources_product_version (product, version)
) ENGINE=InnoDB;

-- latest_product_versions: the version new attempts are billed at, per product; written by the
-- projector from resource.rate_set.
CREATE TABLE latest_product_versions (
  product VARCHAR(100) NOT NULL,
  version VARCHAR(40) NOT NULL,
  time_updated_ms BIGINT NOT NULL,
  PRIMARY KEY (product)
) ENGINE=InnoDB;
