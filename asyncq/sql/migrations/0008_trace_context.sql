-- Tracing: the trace context of the defer that wrote a job (App(tracing=True)), so that
-- the spans of its attempts link to it. The carrier the OpenTelemetry propagator writes,
-- as a JSON object (with the default propagator: {"traceparent": ..., "tracestate": ...}).
--
-- Safe on a live table beside workers of the previous version: a nullable column without
-- a default (no rewrite, no scan); only traced defers write it, and the previous
-- versions neither read nor write it.

ALTER TABLE asyncq_jobs ADD COLUMN trace_context jsonb;
