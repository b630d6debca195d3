BEGIN TRANSACTION;
CREATE TABLE durable_cancel_requests (
	batch_id VARCHAR(64) NOT NULL, 
	requested_at FLOAT NOT NULL, 
	PRIMARY KEY (batch_id)
);
INSERT INTO "durable_cancel_requests" VALUES('legacy-canceled-batch',1.79612049594378447533e+09);
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
	attempts INTEGER NOT NULL, 
	created_at FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (scope, "key")
);
INSERT INTO "durable_idempotency" VALUES('refund','refund-legacy-done','2b8c5599f85534167b735b1a3e9acd185fa28af140530bac627f31f6689a236d','finished','{"amount": 1250, "charge": "ch_legacy"}','{"amount": 1250, "id": "re_legacy_1", "status": "succeeded"}','legacy-run-0001',NULL,0,1.79612061593660068516e+09,0,1.79612049593660068509e+09,1.79612049594080710416e+09);
INSERT INTO "durable_idempotency" VALUES('refund','refund-legacy-pending','47578ac1535409fe6864ac387b642ec7560e3d326dec440a6a185c8b6993d6ca','started','{"amount": 700, "charge": "ch_other"}',NULL,'legacy-run-0001','legacy-run-0001',0,1.79612061593660068516e+09,0,1.79612049593660068509e+09,1.79612049593660068509e+09);
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
INSERT INTO "durable_leases" VALUES('legacy-batch','legacy-run-0001','legacy-host:4242',1,1.79612049594148516658e+09,1.79612051094148516649e+09,0);
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
INSERT INTO "durable_progress" VALUES('legacy-batch','legacy-run-0001',4,7,'Issuing refunds',1,2,1.7961204959429211617e+09);
COMMIT;
