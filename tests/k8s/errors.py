"""API errors and the metav1 Status objects a real apiserver returns for them."""


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self):
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code, reason, message, details=None, status="Failure"):
    obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status,
           "message": message, "reason": reason, "code": code}
    if details:
        obj["details"] = details
    if status == "Success":
        del obj["message"], obj["reason"]
    return obj


def _details(res, name):
    details = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return details


def _what(res, name):
    return '%s "%s"' % (res.plural + ("." + res.group if res.group else ""), name)


def not_found(res, name):
    return ApiError(404, "NotFound", "%s not found" % _what(res, name), _details(res, name))


def already_exists(res, name):
    return ApiError(409, "AlreadyExists", "%s already exists" % _what(res, name), _details(res, name))


def conflict(res, name, why="the object has been modified; please apply your changes to the "
                           "latest version and try again"):
    return ApiError(409, "Conflict", "Operation cannot be fulfilled on %s: %s" % (_what(res, name), why),
                    _details(res, name))


def invalid(res, name, causes):
    """422 Invalid; causes are (reason, field, message) as field.Error renders them."""
    lines = ["%s: %s" % (field, msg) if field else msg for _, field, msg in causes]
    details = dict(_details(res, name), kind=res.kind,
                   causes=[{"reason": r, "message": m, "field": f} for r, f, m in causes])
    what = '%s.%s "%s"' % (res.kind, res.group, name) if res.group else '%s "%s"' % (res.kind, name)
    text = lines[0] if len(lines) == 1 else "[" + ", ".join(lines) + "]"
    return ApiError(422, "Invalid", "%s is invalid: %s" % (what, text), details)


def bad_request(message):
    return ApiError(400, "BadRequest", message)


def gone(message):
    return ApiError(410, "Expired", message)


def method_not_allowed():
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
