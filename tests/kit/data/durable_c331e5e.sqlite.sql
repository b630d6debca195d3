BEGIN TRANSACTION;
CREATE TABLE durable_cancel_requests (
	batch_id VARCHAR(64) NOT NULL, 
	requested_at FLOAT NOT NULL, 
	PRIMARY KEY (batch_id)
);
INSERT INTO "durable_cancel_requests" VALUES('legacy-canceled-batch',1.79612049117288923266e+09);
CREATE TABLE durable_effect_subjects (
	scope VARCHAR(64) NOT NULL, 
	subject VARCHAR(255) NOT NULL, 
	"key" VARCHAR(255) NOT NULL, 
	created_at FLOAT NOT NULL, 
	PRIMARY KEY (scope, subject)
);
INSERT INTO "durable_effect_subjects" VALUES('refund','ch_legacy|requested_by_customer','refund-legacy-done',1.79612049116403484343e+09);
CREATE TABLE durable_idempotency (
	scope VARCHAR(64) NOT NULL, 
	"key" VARCHAR(255) NOT NULL, 
	fingerprint VARCHAR(64) NOT NULL, 
	recovery_point VARCHAR(16) NOT NULL, 
	params TEXT NOT NULL, 
	result TEXT, 
	owner_run VARCHAR(64), 
	claimed_by VARCHAR(64), 
	claim_fence BIGINT NOT NULL, 
	claim_expires_at FLOAT NOT NULL, 
	created_at FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (scope, "key")
);
INSERT INTO "durable_idempotency" VALUES('refund','refund-legacy-done','2b8c5599f85534167b735b1a3e9acd185fa28af140530bac627f31f6689a236d','finished','{"amount": 1250, "charge": "ch_legacy"}','{"amount": 1250, "id": "re_legacy_1", "status": "succeeded"}','legacy-run-0001',NULL,0,1.7961206111640348435e+09,1.79612049116403484343e+09,1.79612049116962599749e+09);
INSERT INTO "durable_idempotency" VALUES('refund','refund-legacy-pending','47578ac1535409fe6864ac387b642ec7560e3d326dec440a6a185c8b6993d6ca','started','{"amount": 700, "charge": "ch_other"}',NULL,'legacy-run-0001','legacy-run-0001',0,1.7961206111640348435e+09,1.79612049116403484343e+09,1.79612049116403484343e+09);
CREATE TABLE durable_leases (
	batch_id VARCHAR(64) NOT NULL, 
	run_id VARCHAR(64) NOT NULL, 
	owner VARCHAR(255) NOT NULL, 
	fence BIGINT NOT NULL, 
	heartbeat_at FLOAT NOT NULL, 
	expires_at FLOAT NOT NULL, 
	released BOOLEAN NOT NULL, 
	PRIMARY KEY (batch_id)
);
INSERT INTO "durable_leases" VALUES('legacy-batch','legacy-run-0001','legacy-host:4242',1,1.7961204911703093052e+09,1.7961205061703093052e+09,0);
CREATE TABLE durable_progress (
	batch_id VARCHAR(64) NOT NULL, 
	run_id VARCHAR(64) NOT NULL, 
	step INTEGER NOT NULL, 
	total INTEGER NOT NULL, 
	label VARCHAR(255) NOT NULL, 
	done BIGINT NOT NULL, 
	"of" BIGINT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (batch_id)
);
INSERT INTO "durable_progress" VALUES('legacy-batch','legacy-run-0001',4,7,'Issuing refunds',1,2,1.79612049117186307911e+09);
CREATE TABLE durable_webhook_outbox (
	webhook_id VARCHAR(64) NOT NULL, 
	url VARCHAR(2000) NOT NULL, 
	batch_id VARCHAR(64) NOT NULL, 
	run_id VARCHAR(64), 
	event_type VARCHAR(64) NOT NULL, 
	body TEXT NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	attempts INTEGER NOT NULL, 
	next_attempt_at FLOAT NOT NULL, 
	claimed_by VARCHAR(64), 
	claim_expires_at FLOAT NOT NULL, 
	last_status INTEGER, 
	last_error TEXT, 
	created_at FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	delivered_at FLOAT, 
	PRIMARY KEY (webhook_id, url)
);
INSERT INTO "durable_webhook_outbox" VALUES('msg_legacy','http://127.0.0.1:9/hook','legacy-batch','legacy-run-0001','batch.failed','{"type":"batch.failed"}','pending',0,1796120491.18424,NULL,0.0,NULL,NULL,1796120491.18424,1796120491.18424,NULL);
CREATE INDEX ix_durable_webhook_outbox_batch_id ON durable_webhook_outbox (batch_id);
COMMIT;
