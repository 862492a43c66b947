-- Rates are USD per unit*ms (e.g. per mCPU*ms), around 1e-12 for compute and 1e-16 for memory:
-- 18 decimal places kept only two or three significant digits of a memory rate. 30 places (the
-- most DECIMAL allows) keep them all; core.billing.default_rates are exact at this scale.
ALTER TABLE resources MODIFY rate DECIMAL(48, 30) NOT NULL;
