-- Argo CD health check for TritonModel (serving.triton-operator.dev).
-- Install it as argocd-cm's `resource.customizations.health.serving.triton-operator.dev_TritonModel`.
--
-- Reads the conditions the operator writes (Ready, Progressing, Degraded, each with observedGeneration):
--   Degraded=True                       -> Degraded (a replica failed, or the spec cannot be deployed)
--   Ready=True                          -> Healthy (every replica serves the desired config, warm; or, at
--                                         spec.replicas 0, ServedByEnsembles or ScaledToZero)
--   anything else                       -> Progressing
-- A status the operator wrote for an older generation says nothing about the current spec: Progressing
-- until status.observedGeneration (and each condition's) reaches metadata.generation.
local hs = { status = "Progressing", message = "Waiting for the operator to report a status" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end

local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = {}
for _, c in ipairs(obj.status.conditions) do
  if c.type ~= nil and (generation == nil or c.observedGeneration == nil or c.observedGeneration >= generation) then
    conditions[c.type] = c
  end
end

local function describe(c)
  if c.message ~= nil and c.message ~= "" then
    return (c.reason or c.type) .. ": " .. c.message
  end
  return c.reason or c.type
end

local degraded, ready, progressing = conditions["Degraded"], conditions["Ready"], conditions["Progressing"]
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded)
elseif ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
elseif progressing ~= nil and progressing.status == "True" then
  hs.message = describe(progressing)
elseif ready ~= nil then
  hs.message = describe(ready)
else
  hs.message = "Waiting for the operator to report the Ready condition of generation " .. tostring(generation)
end
return hs
