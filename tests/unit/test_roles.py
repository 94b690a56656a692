"""The role table (master.core.roles): Determined's ids, names and permission sets, which
roles are cluster-only, and what a set of grants holds where."""

from __future__ import annotations

from master.core import roles
from master.core.roles import Grant


def test_the_built_in_roles_have_determineds_ids_and_sizes() -> None:
    sizes = {r.name: (r.id, len(r.permission_ids), r.cluster_only) for r in roles.ROLES.values()}
    assert sizes == {
        "ClusterAdmin": (1, 60, True),
        "WorkspaceAdmin": (2, 36, False),
        "WorkspaceCreator": (3, 3, True),
        "Viewer": (4, 11, False),
        "Editor": (5, 27, False),
        "ModelRegistryViewer": (6, 3, False),
        "EditorRestricted": (7, 25, False),
        "GenAIUser": (8, 27, True),
        "EditorProjectRestricted": (9, 25, False),
        "TokenCreator": (10, 3, True),
    }
    assert len({p.enum for p in roles.PERMISSIONS.values()}) == 60
    editor, restricted = roles.role_named("Editor"), roles.role_named("EditorRestricted")
    assert editor is not None and restricted is not None
    # EditorRestricted: an Editor who may not start notebooks, shells and commands.
    assert editor.permission_ids - restricted.permission_ids == {roles.CREATE_NSC, roles.UPDATE_NSC}
    assert roles.role_named("Nobody") is None


def test_a_grant_holds_in_its_workspace_and_a_cluster_grant_everywhere() -> None:
    editor_in_7 = [Grant(5, 7)]
    assert roles.holds(editor_in_7, roles.UPDATE_EXPERIMENT, 7)
    assert not roles.holds(editor_in_7, roles.UPDATE_EXPERIMENT, 8)
    assert not roles.holds(editor_in_7, roles.UPDATE_EXPERIMENT, None)
    assert not roles.holds(editor_in_7, roles.DELETE_PROJECT, 7)  # WorkspaceAdmin's, not Editor's
    viewer_everywhere = [Grant(4, None)]
    assert not roles.holds(viewer_everywhere, roles.UPDATE_EXPERIMENT, 7)
    assert roles.holds([Grant(2, None)], roles.DELETE_PROJECT, 12)
    assert roles.holds_anywhere([*editor_in_7, Grant(2, 9)], roles.ASSIGN_ROLES)
    assert not roles.holds_anywhere(editor_in_7, roles.ASSIGN_ROLES)
    assert not roles.holds([Grant(999, None)], roles.UPDATE_EXPERIMENT, 7)  # unknown role
