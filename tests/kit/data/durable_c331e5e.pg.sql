--
-- PostgreSQL database dump
--


-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: durable_cancel_requests; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.durable_cancel_requests (
    batch_id character varying(64) NOT NULL,
    requested_at double precision NOT NULL
);


--
-- Name: durable_effect_subjects; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.durable_effect_subjects (
    scope character varying(64) NOT NULL,
    subject character varying(255) NOT NULL,
    key character varying(255) NOT NULL,
    created_at double precision NOT NULL
);


--
-- Name: durable_idempotency; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.durable_idempotency (
    scope character varying(64) NOT NULL,
    key character varying(255) NOT NULL,
    fingerprint character varying(64) NOT NULL,
    recovery_point character varying(16) NOT NULL,
    params text NOT NULL,
    result text,
    owner_run character varying(64),
    claimed_by character varying(64),
    claim_fence bigint NOT NULL,
    claim_expires_at double precision NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);


--
-- Name: durable_leases; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.durable_leases (
    batch_id character varying(64) NOT NULL,
    run_id character varying(64) NOT NULL,
    owner character varying(255) NOT NULL,
    fence bigint NOT NULL,
    heartbeat_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    released boolean NOT NULL
);


--
-- Name: durable_progress; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.durable_progress (
    batch_id character varying(64) NOT NULL,
    run_id character varying(64) NOT NULL,
    step integer NOT NULL,
    total integer NOT NULL,
    label character varying(255) NOT NULL,
    done bigint NOT NULL,
    of bigint NOT NULL,
    updated_at double precision NOT NULL
);


--
-- Name: durable_webhook_outbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.durable_webhook_outbox (
    webhook_id character varying(64) NOT NULL,
    url character varying(2000) NOT NULL,
    batch_id character varying(64) NOT NULL,
    run_id character varying(64),
    event_type character varying(64) NOT NULL,
    body text NOT NULL,
    state character varying(16) NOT NULL,
    attempts integer NOT NULL,
    next_attempt_at double precision NOT NULL,
    claimed_by character varying(64),
    claim_expires_at double precision NOT NULL,
    last_status integer,
    last_error text,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    delivered_at double precision
);


--
-- Data for Name: durable_cancel_requests; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.durable_cancel_requests VALUES ('legacy-canceled-batch', 1796120491.2513294);


--
-- Data for Name: durable_effect_subjects; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.durable_effect_subjects VALUES ('refund', 'ch_legacy|requested_by_customer', 'refund-legacy-done', 1796120491.2417684);


--
-- Data for Name: durable_idempotency; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.durable_idempotency VALUES ('refund', 'refund-legacy-pending', '47578ac1535409fe6864ac387b642ec7560e3d326dec440a6a185c8b6993d6ca', 'started', '{"amount": 700, "charge": "ch_other"}', NULL, 'legacy-run-0001', 'legacy-run-0001', 0, 1796120611.2417684, 1796120491.2417684, 1796120491.2417684);
INSERT INTO public.durable_idempotency VALUES ('refund', 'refund-legacy-done', '2b8c5599f85534167b735b1a3e9acd185fa28af140530bac627f31f6689a236d', 'finished', '{"amount": 1250, "charge": "ch_legacy"}', '{"amount": 1250, "id": "re_legacy_1", "status": "succeeded"}', 'legacy-run-0001', NULL, 0, 1796120611.2417684, 1796120491.2417684, 1796120491.2474887);


--
-- Data for Name: durable_leases; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.durable_leases VALUES ('legacy-batch', 'legacy-run-0001', 'legacy-host:4242', 1, 1796120491.2485464, 1796120506.2485464, false);


--
-- Data for Name: durable_progress; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.durable_progress VALUES ('legacy-batch', 'legacy-run-0001', 4, 7, 'Issuing refunds', 1, 2, 1796120491.2500536);


--
-- Data for Name: durable_webhook_outbox; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.durable_webhook_outbox VALUES ('msg_legacy', 'http://127.0.0.1:9/hook', 'legacy-batch', 'legacy-run-0001', 'batch.failed', '{"type":"batch.failed"}', 'pending', 0, 1796120491.25193, NULL, 0, NULL, NULL, 1796120491.25193, 1796120491.25193, NULL);


--
-- Name: durable_cancel_requests durable_cancel_requests_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.durable_cancel_requests
    ADD CONSTRAINT durable_cancel_requests_pkey PRIMARY KEY (batch_id);


--
-- Name: durable_effect_subjects durable_effect_subjects_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.durable_effect_subjects
    ADD CONSTRAINT durable_effect_subjects_pkey PRIMARY KEY (scope, subject);


--
-- Name: durable_idempotency durable_idempotency_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.durable_idempotency
    ADD CONSTRAINT durable_idempotency_pkey PRIMARY KEY (scope, key);


--
-- Name: durable_leases durable_leases_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.durable_leases
    ADD CONSTRAINT durable_leases_pkey PRIMARY KEY (batch_id);


--
-- Name: durable_progress durable_progress_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.durable_progress
    ADD CONSTRAINT durable_progress_pkey PRIMARY KEY (batch_id);


--
-- Name: durable_webhook_outbox durable_webhook_outbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.durable_webhook_outbox
    ADD CONSTRAINT durable_webhook_outbox_pkey PRIMARY KEY (webhook_id, url);


--
-- Name: ix_durable_webhook_outbox_batch_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_durable_webhook_outbox_batch_id ON public.durable_webhook_outbox USING btree (batch_id);


--
-- PostgreSQL database dump complete
--


